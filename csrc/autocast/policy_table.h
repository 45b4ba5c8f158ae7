// A compiled policy: the category of every registered op slot.
//
// Tables are immutable once built; switching policy swaps a pointer, so the
// kernel reads them without locks. Each thread has its own stack of active
// tables per engine (autocast state is per thread, engine_key.h); a thread
// with an empty stack uses the engine's process default (plain
// torch.autocast("xla") / torch.autocast("tpu") after `import xla_amp`).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>

#include "cast_category.h"
#include "engine_key.h"

namespace xla_amp {

struct PolicyTable {
  std::string name;
  std::vector<CastCategory> category_of_slot;        // indexed by op slot
  std::unordered_map<int, std::string> banned_reason;  // slot -> message
  // fp32_append_dtype: slot -> the overload that takes a trailing dtype
  std::unordered_map<int, c10::OperatorHandle> append_target;

  CastCategory category(int slot) const {
    return slot < static_cast<int>(category_of_slot.size())
               ? category_of_slot[slot]
               : CastCategory::kNone;
  }
};

using PolicyPtr = std::shared_ptr<const PolicyTable>;

// The table the calling thread's autocast kernels of `engine` use now, or
// nullptr.
const PolicyTable* active_policy(Engine engine);
// The same table, shared: for carrying a region's policy to another thread
// (autograd runs backward on its own device thread).
PolicyPtr active_policy_shared(Engine engine);

void push_thread_policy(Engine engine, PolicyPtr table);
void pop_thread_policy(Engine engine);
int thread_policy_depth(Engine engine);
void set_default_policy(Engine engine, PolicyPtr table);
PolicyPtr default_policy(Engine engine);

// Called (once, lazily) when a kernel runs with no thread policy and no
// default yet: the XLA default depends on the device's hardware, which is
// only known once the XLA runtime is up, i.e. when an XLA tensor exists.
void set_default_resolver(Engine engine, std::function<PolicyPtr()> resolver);

// Builds a table from (slot, category code, banned reason, append target
// "ns::op.overload") rows; the Python Policy validated the names already.
std::shared_ptr<PolicyTable> compile_policy(
    const std::string& name,
    const std::vector<std::tuple<int, int, std::string, std::string>>& rows);

}  // namespace xla_amp
