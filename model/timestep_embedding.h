// The sinusoidal timestep / guidance embedding of FLUX.2 (256 channels, cos half first; see
// model/README.md, "The transformer forward"), computed on the host in float32 exactly as
// diffusers' get_timestep_embedding with flip_sin_to_cos.
// Tested by tests/host/small_units_test.cc.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/base/dtype.h"

namespace flux2 {

// [values.size(), channels] row-major: row i = [cos(v_i·f_0..), sin(v_i·f_0..)], f_k =
// e^(−ln(10⁴)·k/half).
std::vector<float> timestep_sinusoids(std::span<const float> values, int64_t channels);

// The model's scaled conditioning value: the `timestep` (sigma units) or guidance input cast to
// the activation dtype, times 1000, cast again (as diffusers' Flux2Transformer2DModel does).
float scale_conditioning(float value, DType activation_dtype);

// `value` rounded to the activation dtype (bf16) or unchanged (f32), as a cast in PyTorch.
float round_to_activation(float value, DType activation_dtype);

}  // namespace flux2
