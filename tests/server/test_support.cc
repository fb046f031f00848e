// Helpers for the server tests; see test_support.h.
#include "tests/server/test_support.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stb_image.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "model/image_encode.h"
#include "model/safetensors.h"

extern char** environ;

namespace flux2::server::testing {

std::string http_get(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
      char buffer[8192];
      ssize_t n;
      while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0)
        response.append(buffer, static_cast<size_t>(n));
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

std::vector<MetricSample> parse_prometheus_text(const std::string& text) {
  std::vector<MetricSample> samples;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    MetricSample sample;
    size_t pos = line.find_first_of("{ ");
    if (pos == std::string::npos) continue;
    sample.name = line.substr(0, pos);
    if (line[pos] == '{') {
      const size_t end = line.find('}', pos);
      if (end == std::string::npos) continue;
      // name="value" pairs; values here never contain quotes or commas.
      std::string labels = line.substr(pos + 1, end - pos - 1);
      std::istringstream pairs(labels);
      std::string pair;
      while (std::getline(pairs, pair, ',')) {
        const size_t eq = pair.find('=');
        if (eq == std::string::npos || pair.size() < eq + 3) continue;
        sample.labels[pair.substr(0, eq)] = pair.substr(eq + 2, pair.size() - eq - 3);
      }
      pos = end + 1;
    }
    std::string value = line.substr(pos);
    while (!value.empty() && value.front() == ' ') value.erase(value.begin());
    value = value.substr(0, value.find(' '));
    if (!absl::SimpleAtod(value, &sample.value)) continue;
    samples.push_back(std::move(sample));
  }
  return samples;
}

std::optional<double> metric_value(const std::string& text, const std::string& name,
                                   const std::map<std::string, std::string>& labels) {
  std::optional<double> sum;
  for (const MetricSample& sample : parse_prometheus_text(text)) {
    if (sample.name != name) continue;
    bool match = true;
    for (const auto& [key, value] : labels) {
      auto it = sample.labels.find(key);
      if (it == sample.labels.end() || it->second != value) match = false;
    }
    if (match) sum = sum.value_or(0.0) + sample.value;
  }
  return sum;
}

bool wait_for_metric(int port, const std::string& name,
                     const std::map<std::string, std::string>& labels, double expected) {
  const auto limit = std::chrono::steady_clock::now() + kTestWaitLimit;
  while (std::chrono::steady_clock::now() < limit) {
    if (metric_value(http_get(port, "/metrics"), name, labels) == expected) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::shared_ptr<grpc::Channel> local_channel(int port) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials(), args);
}

std::string health_status(const std::shared_ptr<grpc::Channel>& channel,
                          const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok())
    return "error " + std::to_string(status.error_code()) + ": " + status.error_message();
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
}

bool wait_for_health(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                     const std::string& expected) {
  const auto limit = std::chrono::steady_clock::now() + kTestWaitLimit;
  while (std::chrono::steady_clock::now() < limit) {
    if (health_status(channel, service) == expected) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::vector<std::string> bad_request_fields(const grpc::Status& status) {
  std::vector<std::string> fields;
  google::rpc::Status details;
  if (status.error_details().empty() || !details.ParseFromString(status.error_details()))
    return fields;
  for (const google::protobuf::Any& any : details.details()) {
    google::rpc::BadRequest bad_request;
    if (!any.UnpackTo(&bad_request)) continue;
    for (const auto& violation : bad_request.field_violations())
      fields.push_back(violation.field());
  }
  return fields;
}

std::vector<uint8_t> gradient_pixels(int64_t width, int64_t height) {
  std::vector<uint8_t> rgb(static_cast<size_t>(width * height * 3));
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) {
      for (int64_t c = 0; c < 3; ++c) {
        rgb[(y * width + x) * 3 + c] = static_cast<uint8_t>((x * 5 + y * 11 + c * 70) & 0xff);
      }
    }
  }
  return rgb;
}

namespace {

std::string bytes_or_fail(const absl::StatusOr<std::vector<uint8_t>>& bytes) {
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? std::string(bytes->begin(), bytes->end()) : std::string();
}

}  // namespace

std::string gradient_png(int64_t width, int64_t height) {
  return bytes_or_fail(encode_png(gradient_pixels(width, height), width, height));
}

std::string gradient_jpeg(int64_t width, int64_t height) {
  return bytes_or_fail(encode_jpeg(gradient_pixels(width, height), width, height, 90));
}

std::string noise_png(int64_t width, int64_t height) {
  std::vector<uint8_t> rgb(static_cast<size_t>(width * height * 3));
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (uint8_t& value : rgb) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;  // PCG's LCG step
    value = static_cast<uint8_t>(state >> 56);
  }
  return bytes_or_fail(encode_png(rgb, width, height));
}

void expect_golden_png(const std::string& png, const std::string& golden, const std::string& tensor,
                       int width, int height) {
  int decoded_width = 0, decoded_height = 0, channels = 0;
  stbi_uc* pixels = stbi_load_from_memory(reinterpret_cast<const stbi_uc*>(png.data()),
                                          static_cast<int>(png.size()), &decoded_width,
                                          &decoded_height, &channels, 3);
  ASSERT_NE(pixels, nullptr) << "not an image";
  const std::vector<uint8_t> rgb(pixels, pixels + decoded_width * decoded_height * 3);
  stbi_image_free(pixels);
  ASSERT_EQ(decoded_width, width);
  ASSERT_EQ(decoded_height, height);
  auto file = SafetensorsFile::open(golden);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::vector<float>> reference = read_f32(**file, tensor);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->size(), rgb.size());
  const size_t plane = static_cast<size_t>(width) * height;
  int64_t off_by_one = 0, worse = 0;
  for (size_t c = 0; c < 3; ++c) {
    for (size_t i = 0; i < plane; ++i) {
      const int diff = std::abs(static_cast<int>(rgb[i * 3 + c]) -
                                static_cast<int>((*reference)[c * plane + i]));
      off_by_one += diff == 1;
      worse += diff > 1;
    }
  }
  EXPECT_EQ(worse, 0) << tensor;
  EXPECT_LE(static_cast<double>(off_by_one) / static_cast<double>(rgb.size()), 0.005) << tensor;
}

flux2::v1::GenerateImageRequest small_request(uint64_t seed, int steps) {
  flux2::v1::GenerateImageRequest request;
  request.set_prompt("a red fox in the snow, watercolor");
  request.set_width(64);
  request.set_height(48);
  request.set_num_inference_steps(steps);
  request.set_seed(seed);
  return request;
}

UnaryCall::UnaryCall(flux2::v1::ImageGeneration::Stub* stub,
                     flux2::v1::GenerateImageRequest request, std::chrono::milliseconds timeout,
                     const std::string& token) {
  if (timeout.count() > 0) context_.set_deadline(std::chrono::system_clock::now() + timeout);
  if (!token.empty()) context_.AddMetadata("authorization", "Bearer " + token);
  thread_ = std::thread([this, stub, request] {
    status_ = stub->GenerateImage(&context_, request, &response_);
    done_.store(true);
  });
}

UnaryCall::~UnaryCall() {
  if (thread_.joinable()) {
    context_.TryCancel();
    thread_.join();
  }
}

bool UnaryCall::done() const {
  return done_.load();
}

grpc::Status UnaryCall::finish() {
  if (thread_.joinable()) thread_.join();
  return status_;
}

StreamCall::StreamCall(flux2::v1::ImageGeneration::Stub* stub,
                       flux2::v1::GenerateImageRequest request) {
  thread_ = std::thread([this, stub, request] {
    std::unique_ptr<grpc::ClientReader<flux2::v1::GenerateImageStreamResponse>> reader =
        stub->GenerateImageStream(&context_, request);
    flux2::v1::GenerateImageStreamResponse event;
    while (reader->Read(&event)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (event.has_progress()) {
        progress_.push_back(event.progress());
        kinds_ += 'p';
      } else if (event.has_image()) {
        images_.push_back(event.image());
        kinds_ += 'i';
      } else if (event.has_result()) {
        result_ = event.result();
        kinds_ += 'r';
      }
      cv_.notify_all();
    }
    grpc::Status status = reader->Finish();
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    ended_ = true;
    cv_.notify_all();
  });
}

StreamCall::~StreamCall() {
  if (thread_.joinable()) {
    context_.TryCancel();
    thread_.join();
  }
}

bool StreamCall::wait_progress(int n) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, kTestWaitLimit,
               [&] { return static_cast<int>(progress_.size()) >= n || ended_; });
  return static_cast<int>(progress_.size()) >= n;
}

bool StreamCall::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ended_;
}

grpc::Status StreamCall::finish() {
  if (thread_.joinable()) thread_.join();
  return status_;
}

std::vector<flux2::v1::Progress> StreamCall::progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return progress_;
}

flux2::v1::GenerateImageResponse StreamCall::result() const {
  std::lock_guard<std::mutex> lock(mu_);
  return result_;
}

std::vector<flux2::v1::Image> StreamCall::images() const {
  std::lock_guard<std::mutex> lock(mu_);
  return images_;
}

std::string StreamCall::event_kinds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kinds_;
}

std::unique_ptr<ServerProcess> ServerProcess::start(const std::string& binary,
                                                    const std::vector<std::string>& args,
                                                    const std::string& stderr_path) {
  int out[2];
  if (pipe(out) != 0) {
    ADD_FAILURE() << "pipe failed";
    return nullptr;
  }
  std::vector<std::string> argv_strings = {binary,           "--host", "127.0.0.1",   "--port", "0",
                                           "--metrics-port", "0",      "--http-port", "0"};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_strings) argv.push_back(arg.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  if (!stderr_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  auto process = std::unique_ptr<ServerProcess>(new ServerProcess());
  const int spawned =
      posix_spawn(&process->pid_, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (spawned != 0) {
    close(out[0]);
    ADD_FAILURE() << "cannot start " << binary;
    return nullptr;
  }
  // The server prints "flux2_server: listening grpc=P metrics=M http=H" once the ports are bound.
  FILE* stream = fdopen(out[0], "r");
  char line[512];
  while (std::fgets(line, sizeof(line), stream) != nullptr) {
    if (std::sscanf(line, "flux2_server: listening grpc=%d metrics=%d http=%d",
                    &process->grpc_port_, &process->metrics_port_, &process->http_port_) == 3) {
      break;
    }
  }
  // Keep draining stdout in the background so the server never blocks on a full pipe.
  std::thread([stream] {
    char rest[512];
    while (std::fgets(rest, sizeof(rest), stream) != nullptr) {
    }
    std::fclose(stream);
  }).detach();
  if (process->grpc_port_ == 0) ADD_FAILURE() << binary << " did not report its ports";
  return process;
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

void ServerProcess::send_signal(int signal) const {
  kill(pid_, signal);
}

int ServerProcess::wait_exit(std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      exited_ = true;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

}  // namespace flux2::server::testing
