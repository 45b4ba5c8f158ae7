#include "policy_table.h"

#include <mutex>

#include <c10/util/Exception.h>

namespace xla_amp {
namespace {

thread_local std::vector<PolicyPtr> tls_policy_stack;

std::mutex default_mutex;
PolicyPtr default_table;  // guarded by default_mutex
std::function<PolicyPtr()> default_resolver;  // guarded by default_mutex

PolicyPtr resolve_default() {
  std::function<PolicyPtr()> resolver;
  {
    std::lock_guard<std::mutex> lock(default_mutex);
    if (default_table || !default_resolver) return default_table;
    resolver = default_resolver;
  }
  PolicyPtr table = resolver();  // outside the lock: it may take the GIL
  std::lock_guard<std::mutex> lock(default_mutex);
  if (!default_table) default_table = std::move(table);
  return default_table;
}

}  // namespace

const PolicyTable* active_policy() {
  if (!tls_policy_stack.empty()) {
    return tls_policy_stack.back().get();
  }
  // Threads that never entered xla_amp.autocast (plain torch.autocast("xla"),
  // or a thread spawned inside a region) fall back to the process default.
  // Cache it per thread: the default changes only on explicit request.
  thread_local PolicyPtr cached;
  cached = resolve_default();
  return cached.get();
}

PolicyPtr active_policy_shared() {
  if (!tls_policy_stack.empty()) return tls_policy_stack.back();
  return resolve_default();
}

void push_thread_policy(PolicyPtr table) {
  tls_policy_stack.push_back(std::move(table));
}

void pop_thread_policy() {
  TORCH_CHECK(!tls_policy_stack.empty(),
              "xla_amp: policy stack underflow (exit without enter)");
  tls_policy_stack.pop_back();
}

int thread_policy_depth() { return static_cast<int>(tls_policy_stack.size()); }

void set_default_policy(PolicyPtr table) {
  std::lock_guard<std::mutex> lock(default_mutex);
  default_table = std::move(table);
}

void set_default_resolver(std::function<PolicyPtr()> resolver) {
  std::lock_guard<std::mutex> lock(default_mutex);
  default_resolver = std::move(resolver);
}

PolicyPtr default_policy() {
  std::lock_guard<std::mutex> lock(default_mutex);
  return default_table;
}

}  // namespace xla_amp
