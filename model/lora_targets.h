// Where a LoRA adapter may act on the FLUX.2 transformer: every Linear of
// Flux2Transformer2DModel by its diffusers module name, with its shape [out, in] for the running
// config and the rows of our fused weight it feeds (q|k|v of img_qkv, the four modulations of the
// fused [17D] modulation). Tested by tests/host/lora_adapter_test.cc.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "model/flux2_config.h"

namespace flux2 {

// The fused weight of model/flux2_weights.h a module's output lands in.
enum class LoraTargetKind : uint8_t {
  kXEmbedder,
  kContextEmbedder,
  kTimeLinear1,
  kTimeLinear2,
  kGuidanceLinear1,
  kGuidanceLinear2,
  kModulation,  // rows of the fused [17D] modulation (Flux2ModulationLayout)
  kProjOut,
  kDoubleImgQkv,  // transformer_blocks.{block}
  kDoubleTxtQkv,
  kDoubleImgOut,
  kDoubleTxtOut,
  kDoubleImgFfIn,
  kDoubleImgFfOut,
  kDoubleTxtFfIn,
  kDoubleTxtFfOut,
  kSingleQkvMlp,  // single_transformer_blocks.{block}
  kSingleOut,
};

struct LoraTarget {
  LoraTargetKind kind = LoraTargetKind::kXEmbedder;
  int64_t block = -1;        // the block index for block kinds, else -1
  int64_t out_offset = 0;    // first output column of the fused weight this module writes
  int64_t out_features = 0;  // the module's own [out, in]
  int64_t in_features = 0;
};

// Every LoRA-targetable module of a transformer of `config`, keyed by its diffusers module name
// without the "transformer." prefix (e.g. "transformer_blocks.0.attn.to_q", "norm_out.linear").
std::map<std::string, LoraTarget> flux2_lora_targets(const Flux2Config& config);

}  // namespace flux2
