// AMX-BF16 plumbing shared by the tile kernels (attention_amx.cpp, linear_amx.cpp).
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace triforce_amx {

bool usable();  // the CPU has AMX-BF16 and Linux granted this process the tile state

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

}  // namespace triforce_amx
