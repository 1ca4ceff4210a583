// Whether this process may use AMX tiles (see amx.h).
#include "amx.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace triforce_amx {

bool usable() {
  static const bool usable = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;  // arch_prctl: ask Linux for the tile state
    return amx_bf16 && amx_tile && syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return usable;
}

}  // namespace triforce_amx
