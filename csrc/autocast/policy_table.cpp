#include "policy_table.h"

#include "op_name.h"

#include <mutex>

#include <c10/util/Exception.h>

namespace xla_amp {
namespace {

thread_local std::vector<PolicyPtr> tls_policy_stack[kEngineCount];

std::mutex default_mutex;
PolicyPtr default_table[kEngineCount];  // guarded by default_mutex
std::function<PolicyPtr()> default_resolver[kEngineCount];  // guarded by default_mutex

PolicyPtr resolve_default(int e) {
  std::function<PolicyPtr()> resolver;
  {
    std::lock_guard<std::mutex> lock(default_mutex);
    if (default_table[e] || !default_resolver[e]) return default_table[e];
    resolver = default_resolver[e];
  }
  PolicyPtr table = resolver();  // outside the lock: it may take the GIL
  std::lock_guard<std::mutex> lock(default_mutex);
  if (!default_table[e]) default_table[e] = std::move(table);
  return default_table[e];
}

}  // namespace

const PolicyTable* active_policy(Engine engine) {
  const int e = engine_index(engine);
  const std::vector<PolicyPtr>& stack = tls_policy_stack[e];
  if (!stack.empty()) {
    return stack.back().get();
  }
  // Threads that never entered xla_amp.autocast (plain torch.autocast("xla"),
  // or a thread spawned inside a region) fall back to the process default.
  // Cache it per thread: the default changes only on explicit request.
  thread_local PolicyPtr cached[kEngineCount];
  cached[e] = resolve_default(e);
  return cached[e].get();
}

PolicyPtr active_policy_shared(Engine engine) {
  const int e = engine_index(engine);
  if (!tls_policy_stack[e].empty()) return tls_policy_stack[e].back();
  return resolve_default(e);
}

void push_thread_policy(Engine engine, PolicyPtr table) {
  tls_policy_stack[engine_index(engine)].push_back(std::move(table));
}

void pop_thread_policy(Engine engine) {
  std::vector<PolicyPtr>& stack = tls_policy_stack[engine_index(engine)];
  TORCH_CHECK(!stack.empty(), "xla_amp: policy stack underflow (exit without enter)");
  stack.pop_back();
}

int thread_policy_depth(Engine engine) {
  return static_cast<int>(tls_policy_stack[engine_index(engine)].size());
}

void set_default_policy(Engine engine, PolicyPtr table) {
  std::lock_guard<std::mutex> lock(default_mutex);
  default_table[engine_index(engine)] = std::move(table);
}

void set_default_resolver(Engine engine, std::function<PolicyPtr()> resolver) {
  std::lock_guard<std::mutex> lock(default_mutex);
  default_resolver[engine_index(engine)] = std::move(resolver);
}

PolicyPtr default_policy(Engine engine) {
  std::lock_guard<std::mutex> lock(default_mutex);
  return default_table[engine_index(engine)];
}

std::shared_ptr<PolicyTable> compile_policy(
    const std::string& name,
    const std::vector<std::tuple<int, int, std::string, std::string>>& rows) {
  auto table = std::make_shared<PolicyTable>();
  table->name = name;
  for (const auto& [slot, category, reason, append_target] : rows) {
    TORCH_CHECK(slot >= 0 && category >= 0 &&
                    category < static_cast<int>(kCategoryNames.size()),
                "xla_amp: bad policy row (slot ", slot, ", category ", category, ")");
    if (slot >= static_cast<int>(table->category_of_slot.size())) {
      table->category_of_slot.resize(slot + 1, CastCategory::kNone);
    }
    table->category_of_slot[slot] = static_cast<CastCategory>(category);
    if (!reason.empty()) table->banned_reason.emplace(slot, reason);
    if (!append_target.empty()) {
      const OpName target = parse_op_name(append_target);
      table->append_target.emplace(
          slot, c10::Dispatcher::singleton().findSchemaOrThrow(
                    target.qualified().c_str(), target.overload.c_str()));
    }
  }
  return table;
}

}  // namespace xla_amp
