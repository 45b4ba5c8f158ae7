#include "registration.h"

#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "autocast_kernel.h"
#include "op_name.h"
#include "typed_kernels.h"

namespace xla_amp {
namespace {

// Swallows the dispatcher's override warning while we register; every other
// warning goes to the handler that was active before.
class OverrideWarningFilter : public c10::WarningHandler {
 public:
  explicit OverrideWarningFilter(c10::WarningHandler* next) : next_(next) {}
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("Overriding a previously registered kernel") !=
        std::string::npos) {
      return;
    }
    next_->process(warning);
  }

 private:
  c10::WarningHandler* next_;
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<std::string, int> slot_of;  // shared by the engines
  struct PerEngine {
    std::unordered_set<std::string> registered;
    std::vector<std::string> names;  // in registration order
    std::map<std::string, std::unique_ptr<torch::Library>> library_of_namespace;
  } engine[kEngineCount];
  std::unordered_map<std::string, std::string> lower_impl;  // op -> impl
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: kernels outlive exit
  return *r;
}

}  // namespace

RegistrationResult register_ops(Engine engine, const std::vector<std::string>& names) {
  Registry& r = registry();
  Registry::PerEngine& mine = r.engine[engine_index(engine)];
  const c10::DispatchKey key = autocast_key(engine);
  std::lock_guard<std::mutex> lock(r.mutex);
  OverrideWarningFilter filter(c10::WarningUtils::get_warning_handler());
  c10::WarningUtils::WarningHandlerGuard guard(&filter);

  RegistrationResult result;
  for (const std::string& full : names) {
    auto found = r.slot_of.find(full);
    const int slot = found != r.slot_of.end() ? found->second
                                              : static_cast<int>(r.slot_of.size());
    result.slots.push_back(slot);
    if (mine.registered.count(full)) continue;

    const OpName name = parse_op_name(full);
    auto existing = c10::Dispatcher::singleton().findOp({name.qualified(), name.overload});
    if (existing && existing->hasKernelForDispatchKey(key)) {
      ++result.replaced;
    }

    auto& lib = mine.library_of_namespace[name.ns];
    if (!lib) {
      lib = std::make_unique<torch::Library>(torch::Library::IMPL, name.ns, key,
                                             __FILE__, __LINE__);
    }
    if (!register_typed_kernel(*lib, name, slot, engine)) {
      lib->impl(name.name_and_overload().c_str(),
                torch::CppFunction::makeFromBoxedFunctor(
                    std::make_unique<AutocastKernel>(slot, engine)));
    }
    r.slot_of.emplace(full, slot);
    mine.registered.insert(full);
    mine.names.push_back(full);
  }
  return result;
}

std::vector<std::string> registered_ops(Engine engine) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.engine[engine_index(engine)].names;
}

void set_lower_precision_impl(const std::string& op, const std::string& impl) {
  const OpName name = parse_op_name(impl);
  c10::Dispatcher::singleton().findSchemaOrThrow(name.qualified().c_str(),
                                                 name.overload.c_str());
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.lower_impl[op] = impl;
}

std::optional<c10::OperatorHandle> lower_precision_impl(const std::string& op) {
  Registry& r = registry();
  std::string impl;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.lower_impl.find(op);
    if (it == r.lower_impl.end()) return std::nullopt;
    impl = it->second;
  }
  const OpName name = parse_op_name(impl);
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.qualified().c_str(),
                                                        name.overload.c_str());
}

}  // namespace xla_amp
