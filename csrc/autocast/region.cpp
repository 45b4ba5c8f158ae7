#include "region.h"

#include <vector>

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>

namespace xla_amp {
namespace {

struct Saved {
  bool enabled;
  at::ScalarType dtype;
  bool cache_enabled;
};

thread_local std::vector<Saved> tls_saved[kEngineCount];

}  // namespace

void enter_region(Engine engine, PolicyPtr table, bool enabled, at::ScalarType dtype,
                  bool cache_enabled) {
  namespace ac = at::autocast;
  const c10::DeviceType dev = device_type(engine);
  tls_saved[engine_index(engine)].push_back({ac::is_autocast_enabled(dev),
                                             ac::get_autocast_dtype(dev),
                                             ac::is_autocast_cache_enabled()});
  push_thread_policy(engine, std::move(table));
  ac::set_autocast_enabled(dev, enabled);
  ac::set_autocast_dtype(dev, dtype);
  ac::increment_nesting();
  ac::set_autocast_cache_enabled(cache_enabled);
}

void exit_region(Engine engine) {
  namespace ac = at::autocast;
  std::vector<Saved>& saved_stack = tls_saved[engine_index(engine)];
  TORCH_CHECK(!saved_stack.empty(),
              "xla_amp: autocast region exit without a matching enter");
  const Saved saved = saved_stack.back();
  saved_stack.pop_back();
  const c10::DeviceType dev = device_type(engine);
  if (ac::decrement_nesting() == 0) ac::clear_cache();
  ac::set_autocast_enabled(dev, saved.enabled);
  ac::set_autocast_dtype(dev, saved.dtype);
  ac::set_autocast_cache_enabled(saved.cache_enabled);
  pop_thread_policy(engine);
}

}  // namespace xla_amp
