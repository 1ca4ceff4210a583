// AMX-BF16 plumbing shared by the tile kernels (attention_amx.cpp, linear_amx.cpp).
#pragma once
#include <immintrin.h>

#include <cstdint>

// TRIFORCE_WITH_AMX: 1 in the `amx` build (kernels/cpu.py), 0 in the `avx512` build, which is compiled
// without AMX flags so that a toolchain lacking them still builds the vector kernels.
#ifndef TRIFORCE_WITH_AMX
#define TRIFORCE_WITH_AMX 0
#endif

namespace triforce_amx {

#if TRIFORCE_WITH_AMX
bool usable();  // the CPU has AMX-BF16 and Linux granted this process the tile state
#else
inline bool usable() { return false; }
#endif

#if TRIFORCE_WITH_AMX

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Every tile 16 rows x 64 bytes: 16 x 32 bf16 (A), 16 bf16 pairs x 16 (B), 16 x 16 float32 (C).
inline void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
}
#endif

}  // namespace triforce_amx
