// TextEncoderConfig::from_json: the text_encoder/config.json of a klein (Qwen3) or dev (Mistral3)
// checkpoint, checked against the variants we implement (model/README.md, "Text encoders").
// Tested by tests/host/text_encoder_test.cc.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "model/json_util.h"
#include "model/text_encoder.h"

namespace flux2 {
namespace {

// The rope settings, either HF >= 5 style (rope_parameters {rope_type, rope_theta, ...}) or the
// older top-level rope_theta plus rope_scaling {type | rope_type, ...}. Only unscaled ("default")
// RoPE over the whole head is supported.
absl::Status read_rope(const nlohmann::json& json, const std::string& source,
                       TextEncoderConfig& config) {
  auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
  };
  JsonFields top(json, source);
  FLUX_RETURN_IF_ERROR(top.read("rope_theta", &config.rope_theta));
  for (const char* group : {"rope_parameters", "rope_scaling"}) {
    if (!json.contains(group) || json[group].is_null()) continue;
    const nlohmann::json& params = json[group];
    if (!params.is_object()) return invalid(absl::StrCat("field \"", group, "\" is not an object"));
    const std::string where = absl::StrCat(source, " ", group);
    JsonFields fields(params, where);
    for (const char* type_key : {"rope_type", "type"}) {
      std::string type = "default";
      FLUX_RETURN_IF_ERROR(fields.read(type_key, &type));
      if (type != "default") {
        return invalid(absl::StrCat("field \"", group, ".", type_key, "\" is \"", type,
                                    "\"; only \"default\" (unscaled) RoPE is supported"));
      }
    }
    double partial = 1.0;
    FLUX_RETURN_IF_ERROR(fields.read("partial_rotary_factor", &partial));
    if (partial != 1.0) {
      return invalid(absl::StrCat("field \"", group, ".partial_rotary_factor\" is ", partial,
                                  "; only 1.0 (RoPE over the whole head) is supported"));
    }
    FLUX_RETURN_IF_ERROR(fields.read("rope_theta", &config.rope_theta));
  }
  return absl::OkStatus();
}

// Sliding-window attention is not implemented: every layer must be full attention.
absl::Status check_full_attention(const nlohmann::json& json, const std::string& source) {
  JsonFields fields(json, source);
  // Mistral's config names its window "sliding_window" (null: none).
  if (json.contains("sliding_window") && !json["sliding_window"].is_null() &&
      json.value("model_type", "") == "mistral") {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": field \"sliding_window\" is ", json["sliding_window"].dump(),
                     "; sliding-window attention is not supported (it must be null)"));
  }
  bool sliding = false;
  FLUX_RETURN_IF_ERROR(fields.read("use_sliding_window", &sliding));
  if (sliding) {
    return absl::InvalidArgumentError(absl::StrCat(
        source,
        ": field \"use_sliding_window\" is true; sliding-window attention is not supported"));
  }
  if (json.contains("layer_types") && !json["layer_types"].is_null()) {
    const nlohmann::json& types = json["layer_types"];
    if (!types.is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": field \"layer_types\" is not an array"));
    }
    for (size_t i = 0; i < types.size(); ++i) {
      if (!types[i].is_string() || types[i].get<std::string>() != "full_attention") {
        return absl::InvalidArgumentError(absl::StrCat(source, ": field \"layer_types\"[", i,
                                                       "] is ", types[i].dump(),
                                                       "; only \"full_attention\" is supported"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TextEncoderConfig> TextEncoderConfig::from_json(const nlohmann::json& json,
                                                               const std::string& source) {
  auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
  };
  if (!json.is_object()) return invalid("not a JSON object");
  std::string model_type;
  FLUX_RETURN_IF_ERROR(JsonFields(json, source).read("model_type", &model_type));
  if (model_type.empty()) model_type = "qwen3";
  if (model_type == "mistral3") {
    // Mistral3ForConditionalGeneration: the language model's fields are under text_config.
    if (!json.contains("text_config") || !json["text_config"].is_object()) {
      return invalid("model_type \"mistral3\" without a \"text_config\" object");
    }
    FLUX_ASSIGN_OR_RETURN(TextEncoderConfig config,
                          from_json(json["text_config"], source + " text_config"));
    if (config.family != TextEncoderFamily::kMistral) {
      return invalid("field \"text_config.model_type\" must be \"mistral\"");
    }
    return config;
  }
  if (model_type != "qwen3" && model_type != "mistral") {
    return invalid(absl::StrCat("field \"model_type\" is \"", model_type,
                                "\", expected \"qwen3\", \"mistral\" or \"mistral3\""));
  }
  TextEncoderConfig config;
  config.family = model_type == "mistral" ? TextEncoderFamily::kMistral : TextEncoderFamily::kQwen3;
  JsonFields f(json, source);
  FLUX_RETURN_IF_ERROR(f.read("hidden_size", &config.hidden_size, /*required=*/true));
  FLUX_RETURN_IF_ERROR(f.read("num_hidden_layers", &config.num_hidden_layers, /*required=*/true));
  FLUX_RETURN_IF_ERROR(
      f.read("num_attention_heads", &config.num_attention_heads, /*required=*/true));
  config.num_key_value_heads = config.num_attention_heads;  // HF default: no grouping
  FLUX_RETURN_IF_ERROR(f.read("num_key_value_heads", &config.num_key_value_heads));
  FLUX_RETURN_IF_ERROR(f.read("intermediate_size", &config.intermediate_size, /*required=*/true));
  FLUX_RETURN_IF_ERROR(f.read("vocab_size", &config.vocab_size, /*required=*/true));
  FLUX_RETURN_IF_ERROR(f.read("rms_norm_eps", &config.rms_norm_eps));
  FLUX_RETURN_IF_ERROR(f.read("tie_word_embeddings", &config.tie_word_embeddings));
  if (config.num_attention_heads <= 0)
    return invalid("field \"num_attention_heads\" must be positive");
  config.head_dim = -1;
  FLUX_RETURN_IF_ERROR(f.read("head_dim", &config.head_dim));
  if (config.head_dim == -1) {  // absent: HF derives it from the hidden size
    if (config.hidden_size % config.num_attention_heads != 0) {
      return invalid(absl::StrCat("field \"head_dim\" is absent and hidden_size ",
                                  config.hidden_size, " is not a multiple of num_attention_heads ",
                                  config.num_attention_heads));
    }
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }
  FLUX_RETURN_IF_ERROR(read_rope(json, source, config));
  FLUX_RETURN_IF_ERROR(check_full_attention(json, source));

  bool attention_bias = false;
  FLUX_RETURN_IF_ERROR(f.read("attention_bias", &attention_bias));
  if (attention_bias)
    return invalid("field \"attention_bias\" is true; biased projections are not supported");
  std::string act = "silu";
  FLUX_RETURN_IF_ERROR(f.read("hidden_act", &act));
  if (act != "silu")
    return invalid(
        absl::StrCat("field \"hidden_act\" is \"", act, "\", only \"silu\" is supported"));

  if (config.hidden_size <= 0) return invalid("field \"hidden_size\" must be positive");
  if (config.num_hidden_layers <= 0) return invalid("field \"num_hidden_layers\" must be positive");
  if (config.num_key_value_heads <= 0 ||
      config.num_attention_heads % config.num_key_value_heads != 0) {
    return invalid(absl::StrCat("field \"num_key_value_heads\" is ", config.num_key_value_heads,
                                "; it must divide num_attention_heads ",
                                config.num_attention_heads));
  }
  if (config.head_dim <= 0 || config.head_dim % 2 != 0) {
    return invalid(
        absl::StrCat("field \"head_dim\" is ", config.head_dim, "; it must be even and positive"));
  }
  if (config.intermediate_size <= 0) return invalid("field \"intermediate_size\" must be positive");
  if (config.vocab_size <= 0 || config.vocab_size > (int64_t{1} << 31)) {
    return invalid("field \"vocab_size\" must be positive and fit int32 token ids");
  }
  if (!(config.rms_norm_eps > 0)) return invalid("field \"rms_norm_eps\" must be positive");
  if (!(config.rope_theta > 0) || !std::isfinite(config.rope_theta)) {
    return invalid("field \"rope_theta\" must be positive");
  }
  return config;
}

TextEncoderConfig TextEncoderConfig::mistral_small_3() {
  TextEncoderConfig config;
  config.family = TextEncoderFamily::kMistral;
  config.hidden_size = 5120;
  config.num_hidden_layers = 40;
  config.num_attention_heads = 32;
  config.num_key_value_heads = 8;
  config.head_dim = 128;
  config.intermediate_size = 32768;
  config.vocab_size = 131072;
  config.rms_norm_eps = 1e-5;
  config.rope_theta = 1e9;
  config.tie_word_embeddings = false;
  return config;
}

}  // namespace flux2
