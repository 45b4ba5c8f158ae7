// Which autocast dispatch key an engine instance serves, chosen at runtime:
// the torch_xla engine (AutocastXLA, device type XLA) or the PrivateUse1
// engine (AutocastPrivateUse1, e.g. TorchTPU's "tpu"). The same kernels,
// tables and recorder serve both; each key has its own registrations,
// per-thread policy stack, default policy and region state.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace xla_amp {

enum class Engine : uint8_t { kXla = 0, kPrivateUse1 = 1 };
inline constexpr int kEngineCount = 2;

inline int engine_index(Engine e) { return static_cast<int>(e); }

inline Engine engine_from_code(int code) {
  TORCH_CHECK(code >= 0 && code < kEngineCount, "xla_amp: unknown engine code ", code,
              " (0: AutocastXLA, 1: AutocastPrivateUse1)");
  return static_cast<Engine>(code);
}

inline c10::DispatchKey autocast_key(Engine e) {
  return e == Engine::kXla ? c10::DispatchKey::AutocastXLA
                           : c10::DispatchKey::AutocastPrivateUse1;
}

inline c10::DeviceType device_type(Engine e) {
  return e == Engine::kXla ? c10::DeviceType::XLA : c10::DeviceType::PrivateUse1;
}

// Redispatch target for an op the active policy leaves alone: everything
// below the engine's autocast key, as if no autocast kernel were registered.
inline c10::DispatchKeySet below_autocast(Engine e) {
  static const c10::DispatchKeySet below[kEngineCount] = {
      c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::AutocastXLA),
      c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER,
                          c10::DispatchKey::AutocastPrivateUse1)};
  return below[engine_index(e)];
}

}  // namespace xla_amp
