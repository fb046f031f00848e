// Checkpoint flags; see checkpoint_flags.h.
#include "server/common/checkpoint_flags.h"

#include <CLI/CLI.hpp>

#include "kernels/base/status.h"

namespace flux2 {

std::vector<CLI::Option*> add_checkpoint_flags(CLI::App& app, CheckpointFlags& flags) {
  return {app.add_option("--transformer-file", flags.transformer_file)->type_name("FILE"),
          app.add_option("--text-encoder-file", flags.text_encoder_file)->type_name("FILE"),
          app.add_option("--fp8-lossless", flags.fp8_lossless)->type_name("resident|per_layer"),
          app.add_option("--fp8-input-scale", flags.fp8_input_scale)->type_name("dynamic|static")};
}

absl::Status check_checkpoint_flags(const CheckpointFlags& flags) {
  FLUX_RETURN_IF_ERROR(parse_fp8_lossless(flags.fp8_lossless).status());
  return parse_fp8_input_scale(flags.fp8_input_scale).status();
}

absl::Status apply_checkpoint_flags(const CheckpointFlags& flags, PipelineOptions& options) {
  options.transformer_file = flags.transformer_file;
  options.text_encoder_file = flags.text_encoder_file;
  FLUX_ASSIGN_OR_RETURN(options.fp8_lossless, parse_fp8_lossless(flags.fp8_lossless));
  FLUX_ASSIGN_OR_RETURN(options.fp8_input_scale, parse_fp8_input_scale(flags.fp8_input_scale));
  return absl::OkStatus();
}

std::string checkpoint_flags_help() {
  return "  --transformer-file FILE  load the transformer's weights from this single file (Black "
         "Forest\n"
         "                           Labs naming: flux2-dev.safetensors, or FP8: BFL's "
         "klein-*-fp8,\n"
         "                           ComfyUI's fp8mixed and scaled fp8) or transformer folder (a\n"
         "                           ModelOpt FP8 export) instead of <model-dir>/transformer/'s\n"
         "                           (whose config.json is still read for a file); the format\n"
         "                           detected is logged and reported by GetModelInfo\n"
         "  --text-encoder-file FILE load the text encoder from this single safetensors file (HF\n"
         "                           names as in ComfyUI's text-encoder files; bf16, or FP8: e.g.\n"
         "                           mistral_3_small_flux2_fp8.safetensors) instead of\n"
         "                           <model-dir>/text_encoder/'s (whose config.json is still "
         "read);\n"
         "                           an FP8 file stays FP8 on the GPU and each layer is "
         "dequantized as\n"
         "                           it runs (same numerics as the dequantized weights; with\n"
         "                           --text-encoder-offload it is dequantized into host memory "
         "and\n"
         "                           streamed as bf16); the format detected is logged and "
         "reported\n"
         "                           by GetModelInfo.components\n"
         "  --fp8-lossless MODE      how an FP8 transformer file serves quality=lossless: "
         "resident\n"
         "                           (default: its dequantized bf16 values stay on the GPU, bf16\n"
         "                           speed; with quality=high the file's FP8 bytes stay too) or\n"
         "                           per_layer (only the file's FP8 bytes stay: about half the\n"
         "                           memory, quality=high runs on them directly, and each\n"
         "                           lossless GEMM first dequantizes its weight into a scratch\n"
         "                           buffer). Both give the same lossless bits; GetModelInfo "
         "reports\n"
         "                           it\n"
         "  --fp8-input-scale MODE   the activation scales of quality=high's FP8 GEMMs on an FP8\n"
         "                           transformer file: dynamic (default: each activation row "
         "under\n"
         "                           its own scale, amax / 448) or static (a GEMM whose weight "
         "has\n"
         "                           the file's input_scale quantizes its activation per tensor\n"
         "                           under it, e4m3(x / input_scale), as ModelOpt and TensorRT "
         "do;\n"
         "                           the others stay dynamic). static needs quality=high and a "
         "file\n"
         "                           with input scales, else start-up fails; the log and\n"
         "                           GetModelInfo say how many GEMMs use static scales\n";
}

}  // namespace flux2
