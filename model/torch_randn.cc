// Placeholder until the torch.randn re-implementation lands (issue 3).
#include "model/torch_randn.h"

namespace flux2 {

std::vector<float> torch_randn_f32(uint64_t seed, int64_t numel) { return {}; }
std::vector<float> torch_randn_bf16(uint64_t seed, int64_t numel) { return {}; }

}  // namespace flux2
