// The production engine over model/pipeline.h; see pipeline_engine.h.
// Tested by the end-to-end tests in tests/server/.
#include "server/serving/pipeline_engine.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/backend_factory.h"
#include "kernels/base/status.h"

namespace flux2::server {
namespace {

class PipelineEngine final : public Engine {
 public:
  PipelineEngine(std::unique_ptr<Backend> backend, std::unique_ptr<Pipeline> pipeline)
      : backend_(std::move(backend)), pipeline_(std::move(pipeline)) {}
  ~PipelineEngine() override {
    pipeline_.reset();  // releases device tensors before the backend goes
  }

  const PipelineInfo& info() const override { return pipeline_->info(); }
  std::vector<FieldViolation> check(const GenerateParams& params) const override {
    return pipeline_->check(params);
  }
  absl::StatusOr<GeneratedImage> generate(const GenerateParams& params,
                                          const GenerateHooks& hooks) override {
    return pipeline_->generate(params, hooks);
  }
  std::vector<BackendMemoryStats> memory_stats() const override {
    return {backend_->memory_stats()};
  }
  absl::Status device_status() override { return backend_->device_status(); }
  absl::Status inject_fault(InjectedFault fault, double hang_seconds) override {
    return backend_->inject_fault(fault, hang_seconds);
  }
  const Flux2Config* transformer_config() const override {
    return &pipeline_->transformer_config();
  }
  const Flux2Config* lora_config() const override { return &pipeline_->transformer_config(); }
  LoraHostImageMaker lora_host_image_maker() const override {
    return flux2::lora_host_image_maker(*backend_, pipeline_->transformer_config());
  }
  absl::Status pin_lora(const LoraRequest& lora) const override {
    return pipeline_->lora_cache().pin(*backend_, pipeline_->transformer_config(), lora);
  }
  std::optional<LoraCacheStats> lora_cache_stats() const override {
    return pipeline_->lora_cache().stats();
  }
  bool lora_resident(const std::string& key) const override {
    return pipeline_->lora_cache().resident(key);
  }

 private:
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Pipeline> pipeline_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> create_server_backend(absl::string_view requested,
                                                               const BackendOptions& options,
                                                               bool model_dir_given) {
  if (requested == "auto") {
    // The embedded tiny checkpoint always runs on the CPU, so the README's run command works
    // anywhere; a real checkpoint goes to the GPU when there is one.
    if (model_dir_given && cuda_backend_compiled()) {
      absl::StatusOr<std::unique_ptr<Backend>> cuda = create_backend("cuda", options);
      if (!absl::IsNotFound(cuda.status())) {
        if (cuda.ok()) return cuda;
        return absl::Status(cuda.status().code(),
                            absl::StrCat("--backend auto: ", cuda.status().message()));
      }
    }
    return create_backend("cpu", options);
  }
  if (requested != "cpu" && requested != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend: \"", requested, "\" is not auto, cpu or cuda"));
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend = create_backend(requested, options);
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat("--backend ", requested, ": ", backend.status().message()));
  }
  return backend;
}

absl::StatusOr<std::unique_ptr<Pipeline>> load_server_pipeline(Backend& backend,
                                                               const std::string& model_dir,
                                                               const PipelineOptions& options) {
  absl::StatusOr<std::unique_ptr<Pipeline>> pipeline = Pipeline::load(backend, model_dir, options);
  if (pipeline.ok()) return pipeline;
  const absl::Status& status = pipeline.status();
  // quality=high needs backend support (FP8 GEMMs): say which flag asked for it.
  const bool high_unsupported = options.enable_quality_high && absl::IsUnimplemented(status);
  const bool transformer_file = !options.transformer_file.empty() &&
                                absl::StrContains(status.message(), options.transformer_file);
  // The loader's messages mostly start with the path they concern; do not say it twice.
  const bool names_dir = absl::StartsWith(status.message(), model_dir);
  return absl::Status(
      status.code(),
      absl::StrCat(high_unsupported ? "--enable-quality-high: " : "",
                   transformer_file ? "--transformer-file: " : "",
                   names_dir ? "loading " : absl::StrCat("loading ", model_dir, ": "),
                   status.message()));
}

absl::StatusOr<std::unique_ptr<Engine>> load_pipeline_engine(absl::string_view backend_name,
                                                             const BackendOptions& backend_options,
                                                             bool model_dir_given,
                                                             const std::string& model_dir,
                                                             const PipelineOptions& options) {
  FLUX_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend,
                        create_server_backend(backend_name, backend_options, model_dir_given));
  FLUX_ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> pipeline,
                        load_server_pipeline(*backend, model_dir, options));
  return std::unique_ptr<Engine>(new PipelineEngine(std::move(backend), std::move(pipeline)));
}

absl::StatusOr<std::unique_ptr<Engine>> random_pipeline_engine(std::unique_ptr<Backend> backend,
                                                               const RandomPipelineSpec& spec) {
  FLUX_ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> pipeline,
                        Pipeline::create_random(*backend, spec));
  return std::unique_ptr<Engine>(new PipelineEngine(std::move(backend), std::move(pipeline)));
}

}  // namespace flux2::server
