#pragma once
// Entering and leaving an xla_amp.autocast region, one native call each:
// the region's policy goes on the thread's policy stack of its engine and
// that engine's device autocast state (XLA or PrivateUse1: enabled, dtype,
// weight-cache flag, nesting depth) changes as torch.amp.autocast's
// __enter__/__exit__ change it. The state to restore is kept here, per
// thread and engine, so one region object may be entered recursively.
#include <c10/core/ScalarType.h>

#include "engine_key.h"
#include "policy_table.h"

namespace xla_amp {

void enter_region(Engine engine, PolicyPtr table, bool enabled, at::ScalarType dtype,
                  bool cache_enabled);
// Restores what the matching enter_region saw; the weight cache is dropped
// when the outermost autocast region (of any kind) closes.
void exit_region(Engine engine);

}  // namespace xla_amp
