#include "registration.h"

#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

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
  std::unordered_map<std::string, int> slot_of;
  std::vector<std::string> names;
  std::map<std::string, std::unique_ptr<torch::Library>> library_of_namespace;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: kernels outlive exit
  return *r;
}

}  // namespace

RegistrationResult register_ops(const std::vector<std::string>& names) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  OverrideWarningFilter filter(c10::WarningUtils::get_warning_handler());
  c10::WarningUtils::WarningHandlerGuard guard(&filter);

  RegistrationResult result;
  for (const std::string& full : names) {
    auto found = r.slot_of.find(full);
    if (found != r.slot_of.end()) {
      result.slots.push_back(found->second);
      continue;
    }
    const OpName name = parse_op_name(full);
    auto existing = c10::Dispatcher::singleton().findOp({name.qualified(), name.overload});
    if (existing &&
        existing->hasKernelForDispatchKey(c10::DispatchKey::AutocastXLA)) {
      ++result.replaced;
    }

    auto& lib = r.library_of_namespace[name.ns];
    if (!lib) {
      lib = std::make_unique<torch::Library>(
          torch::Library::IMPL, name.ns, c10::DispatchKey::AutocastXLA, __FILE__,
          __LINE__);
    }
    const int slot = static_cast<int>(r.names.size());
    if (!register_typed_kernel(*lib, name, slot)) {
      lib->impl(name.name_and_overload().c_str(),
                torch::CppFunction::makeFromBoxedFunctor(
                    std::make_unique<AutocastKernel>(slot)));
    }
    r.slot_of.emplace(full, slot);
    r.names.push_back(full);
    result.slots.push_back(slot);
  }
  return result;
}

std::vector<std::string> registered_ops() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.names;
}

}  // namespace xla_amp
