// The LoRA adapter registry (server/serving/lora_registry.h) on copies of the tiny-klein adapters
// in a temp --lora-dir: names, traversal / absolute / symlink refusals, not found, caching, a
// changed file reloading, the host LRU by bytes, the upload images, the listing; and validate()'s
// loras checks.
// Run: build/bin/server_unit_tests --gtest_filter='Lora*'
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/json_util.h"
#include "server/serving/lora_registry.h"
#include "server/serving/validate.h"

namespace flux2::server {
namespace {

namespace fs = std::filesystem;

const std::string kData = FLUX2_TEST_DATA_DIR;

Flux2Config tiny_config() {
  absl::StatusOr<nlohmann::json> json =
      read_json_file(kData + "/tiny-klein/checkpoint/transformer/config.json");
  EXPECT_TRUE(json.ok()) << json.status();
  absl::StatusOr<Flux2Config> config = Flux2Config::from_json(*json, "tiny-klein");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class LoraRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("flux2_lora_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(dir() + "/styles");
    fs::create_directories(root_ / "outside");
    copy("style_diffusers", "style");
    copy("bfl_aitoolkit", "styles/bfl");
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string dir() const { return (root_ / "loras").string(); }
  void copy(const std::string& golden, const std::string& name) {
    fs::copy_file(kData + "/tiny-klein/loras/" + golden + ".safetensors",
                  dir() + "/" + name + ".safetensors", fs::copy_options::overwrite_existing);
  }
  std::unique_ptr<LoraRegistry> open(int64_t host_bytes = int64_t{1} << 30) {
    LoraRegistryOptions options{dir(), host_bytes, 256};
    absl::StatusOr<std::unique_ptr<LoraRegistry>> registry =
        LoraRegistry::open(options, config_, nullptr);
    EXPECT_TRUE(registry.ok()) << registry.status();
    return registry.ok() ? std::move(*registry) : nullptr;
  }

  fs::path root_;
  Flux2Config config_ = tiny_config();
};

TEST_F(LoraRegistryTest, ResolvesByNameHashesTheFileAndCachesIt) {
  auto registry = open();
  absl::StatusOr<ResolvedLora> style = registry->resolve("style");
  ASSERT_TRUE(style.ok()) << style.status();
  EXPECT_EQ(style->name, "style");
  EXPECT_EQ(style->sha256, sha256_hex(read_bytes(dir() + "/style.safetensors")));
  EXPECT_EQ(style->sha256.size(), 64u);
  EXPECT_EQ(lora_layout_name(style->adapter->layout), std::string("diffusers"));
  absl::StatusOr<ResolvedLora> nested = registry->resolve("styles/bfl");
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_EQ(nested->adapter->max_rank(), 8);
  ASSERT_TRUE(registry->resolve("style").ok());
  const LoraHostStats stats = registry->stats();
  EXPECT_EQ(stats.misses, 2);
  EXPECT_EQ(stats.hits, 1);
  EXPECT_EQ(stats.adapters, 2);
  // The same adapter object is served from the cache.
  EXPECT_EQ(registry->resolve("style")->adapter.get(), style->adapter.get());
}

TEST(LoraNameTest, SHA256OfTheEmptyStringIsTheKnownDigest) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_F(LoraRegistryTest, RefusesTraversalAbsolutePathsAndEmptyNames) {
  auto registry = open();
  absl::StatusOr<ResolvedLora> up = registry->resolve("../outside/x");
  EXPECT_TRUE(absl::IsInvalidArgument(up.status())) << up.status();
  EXPECT_NE(up.status().message().find("'..'"), std::string::npos) << up.status();
  absl::StatusOr<ResolvedLora> absolute = registry->resolve(dir() + "/style");
  EXPECT_TRUE(absl::IsInvalidArgument(absolute.status())) << absolute.status();
  EXPECT_NE(absolute.status().message().find("absolute"), std::string::npos);
  EXPECT_FALSE(check_lora_name("").ok());
  EXPECT_FALSE(check_lora_name("styles//bfl").ok());
  EXPECT_FALSE(check_lora_name("./style").ok());
  EXPECT_TRUE(check_lora_name("styles/bfl").ok());
}

TEST_F(LoraRegistryTest, RefusesASymlinkResolvingOutsideTheDirectory) {
  fs::copy_file(kData + "/tiny-klein/loras/kohya.safetensors", root_ / "outside/kohya.safetensors");
  fs::create_symlink(root_ / "outside/kohya.safetensors", dir() + "/evil.safetensors");
  fs::create_directory_symlink(root_ / "outside", dir() + "/linked");
  auto registry = open();
  for (const char* name : {"evil", "linked/kohya"}) {
    absl::StatusOr<ResolvedLora> lora = registry->resolve(name);
    EXPECT_TRUE(absl::IsPermissionDenied(lora.status())) << name << ": " << lora.status();
    EXPECT_NE(lora.status().message().find("outside --lora-dir"), std::string::npos);
  }
  // A symlink that stays inside is followed.
  fs::create_symlink(dir() + "/style.safetensors", dir() + "/alias.safetensors");
  EXPECT_TRUE(registry->resolve("alias").ok());
}

TEST_F(LoraRegistryTest, NamesAMissingAdapter) {
  auto registry = open();
  absl::StatusOr<ResolvedLora> lora = registry->resolve("foo");
  EXPECT_TRUE(absl::IsNotFound(lora.status()));
  EXPECT_EQ(lora.status().message(), "no adapter 'foo' under --lora-dir");
  EXPECT_STREQ(lora_failure_reason(lora.status()), "not_found");
}

TEST_F(LoraRegistryTest, RefusesAFileThatIsNoAdapterWithTheParsersMessage) {
  std::ofstream(dir() + "/junk.safetensors") << "not a safetensors file at all";
  auto registry = open();
  absl::StatusOr<ResolvedLora> lora = registry->resolve("junk");
  EXPECT_TRUE(absl::IsInvalidArgument(lora.status()));
  EXPECT_NE(lora.status().message().find("not a safetensors file"), std::string::npos)
      << lora.status();
  EXPECT_STREQ(lora_failure_reason(lora.status()), "format");
}

TEST_F(LoraRegistryTest, RefusesARankOverTheLimit) {
  LoraRegistryOptions options{dir(), int64_t{1} << 30, 7};
  auto registry = LoraRegistry::open(options, config_, nullptr);
  ASSERT_TRUE(registry.ok());
  absl::StatusOr<ResolvedLora> lora = (*registry)->resolve("styles/bfl");  // rank 8
  ASSERT_FALSE(lora.ok());
  EXPECT_NE(lora.status().message().find("exceeds --max-lora-rank 7"), std::string::npos)
      << lora.status();
  EXPECT_STREQ(lora_failure_reason(lora.status()), "rank");
}

TEST_F(LoraRegistryTest, AChangedFileIsLoadedAgain) {
  auto registry = open();
  absl::StatusOr<ResolvedLora> before = registry->resolve("style");
  ASSERT_TRUE(before.ok());
  copy("bfl_aitoolkit", "style");  // another adapter under the same name (another size)
  absl::StatusOr<ResolvedLora> after = registry->resolve("style");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_NE(after->sha256, before->sha256);
  EXPECT_EQ(lora_layout_name(after->adapter->layout), std::string("bfl"));
  EXPECT_EQ(registry->stats().misses, 2);
  EXPECT_EQ(registry->stats().adapters, 1);
}

TEST_F(LoraRegistryTest, TheHostCacheEvictsTheLeastRecentlyUsedByBytes) {
  int64_t style_bytes = 0, bfl_bytes = 0;
  {
    auto sizing = open();
    ASSERT_TRUE(sizing->resolve("style").ok());
    style_bytes = sizing->stats().bytes;
    ASSERT_TRUE(sizing->resolve("styles/bfl").ok());
    bfl_bytes = sizing->stats().bytes - style_bytes;
  }
  ASSERT_GT(style_bytes, 0);
  ASSERT_GT(bfl_bytes, 0);
  auto registry = open(style_bytes + bfl_bytes - 1);  // one of them, not both
  ASSERT_TRUE(registry->resolve("style").ok());
  ASSERT_TRUE(registry->resolve("styles/bfl").ok());  // evicts style
  LoraHostStats stats = registry->stats();
  EXPECT_EQ(stats.evictions, 1);
  EXPECT_EQ(stats.adapters, 1);
  EXPECT_EQ(stats.bytes, bfl_bytes);
  ASSERT_TRUE(registry->resolve("styles/bfl").ok());  // still there: a hit
  EXPECT_EQ(registry->stats().hits, 1);
  ASSERT_TRUE(registry->resolve("style").ok());  // evicted: loaded again
  EXPECT_EQ(registry->stats().misses, 3);
}

// With make_host_image (the server's: lora_host_image_maker of the engine's backend), each load
// also packs the adapter for its upload, and the host cache counts the image. A maker that fails
// leaves the adapter served without one; one too large for the cache gets none.
TEST_F(LoraRegistryTest, PacksAnUploadImageWithEachLoadAndCountsItsBytes) {
  auto plain = open();
  ASSERT_TRUE(plain->resolve("style").ok());
  const int64_t without_image = plain->stats().bytes;
  CpuBackend backend;  // as lora_host_image_maker does for a GPU, on the CPU's memory
  LoraRegistryOptions options{dir(), int64_t{1} << 30, 256};
  options.make_host_image = [&](const LoraAdapter& adapter) {
    return LoraHostImage::make(config_, adapter, DType::kF32, [&](DType dtype, Shape shape) {
      return backend.empty(dtype, std::move(shape));
    });
  };
  EXPECT_EQ(lora_host_image_maker(backend, config_), nullptr);  // the CPU backend makes none
  auto packing = LoraRegistry::open(options, config_, nullptr);
  ASSERT_TRUE(packing.ok()) << packing.status();
  absl::StatusOr<ResolvedLora> style = (*packing)->resolve("style");
  ASSERT_TRUE(style.ok()) << style.status();
  ASSERT_NE(style->image, nullptr);
  const LoraPacking layout = pack_lora_modules(config_, *style->adapter, 4).value();
  EXPECT_EQ(style->image->values().numel(), layout.values);
  EXPECT_EQ((*packing)->stats().bytes, without_image + style->image->bytes());
  EXPECT_EQ((*packing)->resolve("style")->image.get(), style->image.get());  // cached with it

  options.make_host_image =
      [](const LoraAdapter&) -> absl::StatusOr<std::shared_ptr<const LoraHostImage>> {
    return absl::ResourceExhaustedError("no page-locked memory");
  };
  auto failing = LoraRegistry::open(options, config_, nullptr);
  ASSERT_TRUE(failing.ok());
  absl::StatusOr<ResolvedLora> served = (*failing)->resolve("style");
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(served->image, nullptr);
  EXPECT_EQ((*failing)->stats().bytes, without_image);

  options.make_host_image =
      [](const LoraAdapter&) -> absl::StatusOr<std::shared_ptr<const LoraHostImage>> {
    ADD_FAILURE() << "an image for an adapter the cache cannot keep";
    return nullptr;
  };
  options.host_cache_bytes = without_image;  // the adapter fits, the adapter and an image do not
  auto small = LoraRegistry::open(options, config_, nullptr);
  ASSERT_TRUE(small.ok());
  ASSERT_TRUE((*small)->resolve("style").ok());
}

TEST_F(LoraRegistryTest, ListsEveryAdapterFileWithWhatIsKnownOfTheLoadedOnes) {
  auto registry = open();
  ASSERT_TRUE(registry->resolve("styles/bfl").ok());
  registry->mark_pinned("styles/bfl");
  const std::vector<LoraListing> listing = registry->list([](const std::string&) { return true; });
  ASSERT_EQ(listing.size(), 2u);
  EXPECT_EQ(listing[0].name, "style");
  EXPECT_FALSE(listing[0].loaded);
  EXPECT_GT(listing[0].bytes, 0);
  EXPECT_EQ(listing[1].name, "styles/bfl");
  EXPECT_TRUE(listing[1].loaded);
  EXPECT_EQ(listing[1].layout, "bfl");
  EXPECT_EQ(listing[1].max_rank, 8);
  EXPECT_GT(listing[1].modules, 0);
  EXPECT_EQ(listing[1].sha256_prefix.size(), 12u);
  EXPECT_TRUE(listing[1].resident);
  EXPECT_TRUE(listing[1].pinned);
}

TEST(LoraRegistryOpenTest, RefusesAMissingDirectoryNamingTheFlag) {
  LoraRegistryOptions options{"/nonexistent/flux2/loras", 1 << 20, 256};
  auto registry = LoraRegistry::open(options, Flux2Config{}, nullptr);
  ASSERT_FALSE(registry.ok());
  EXPECT_NE(registry.status().message().find("--lora-dir"), std::string::npos);
}

// ---- validate()'s loras checks ---------------------------------------------------------------

GenerateRequest lora_request(std::vector<LoraSpec> loras) {
  GenerateRequest request;
  request.prompt = "a fox";
  request.width = 64;
  request.height = 48;
  request.loras = std::move(loras);
  return request;
}

Limits lora_limits() {
  Limits limits;
  limits.lora_enabled = true;
  limits.max_loras_per_request = 4;
  limits.max_lora_scale = 8.0;
  return limits;
}

std::string refusal(const GenerateRequest& request, const Limits& limits) {
  absl::StatusOr<JobSpec> spec = validate(request, limits, 1);
  EXPECT_FALSE(spec.ok());
  return spec.ok() ? "" : std::string(spec.status().message());
}

TEST(LoraValidateTest, EachRefusalNamesItsField) {
  Limits off;
  EXPECT_EQ(refusal(lora_request({{"style", {}}}), off), "loras: this server has no --lora-dir");
  const Limits limits = lora_limits();
  EXPECT_EQ(refusal(lora_request({{"a", {}}, {"b", {}}, {"c", {}}, {"d", {}}, {"e", {}}}), limits),
            "loras: 5 adapters exceed 4");
  EXPECT_EQ(refusal(lora_request({{"a", {}}, {"pixel-art", {}}, {"pixel-art", {}}}), limits),
            "loras[2].name: 'pixel-art' repeated");
  EXPECT_EQ(refusal(lora_request({{"a", std::nan("")}}), limits),
            "loras[0].scale: nan is not finite");
  EXPECT_EQ(refusal(lora_request({{"a", 8.5}}), limits), "loras[0].scale: 8.5 is outside -8..8");
  EXPECT_EQ(refusal(lora_request({{"", 1.0}}), limits), "loras[0].name: is empty");
  EXPECT_NE(refusal(lora_request({{"../x", 1.0}}), limits).find("loras[0].name: '../x' has a '..'"),
            std::string::npos);
  EXPECT_TRUE(validate(lora_request({{"a", -8.0}, {"b", {}}}), limits, 1).ok());
  const absl::StatusOr<JobSpec> none = validate(lora_request({}), Limits{}, 1);
  EXPECT_TRUE(none.ok());
}

}  // namespace
}  // namespace flux2::server
