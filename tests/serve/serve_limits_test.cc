// `trainctl-trainer serve`'s checks before work, with real requests to the real server on the tiny
// model and the real Qwen tokenizer: images whose headers cannot fit the context are refused from
// their headers (crafted PNGs whose IHDR says 13000x13000 over no pixel data: any decoding would
// fail differently), a body whose text alone cannot fit is refused before tokenizing, the
// min/max_pixels the server was started with decide an image's tokens as HF's processor's do,
// and the binary's --min_pixels/--max_pixels/--max_body_mb flags (a 413 over the limit).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/data/image_processor.h"
#include "nlohmann/json.hpp"
#include "tests/data/qwen_tokenizer.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "worker/trainer/model/generation.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/model/state_dict_adapter.h"
#include "worker/trainer/serve/generation_queue.h"
#include "worker/trainer/serve/openai_server.h"
#include "worker/trainer/serve/request_budget.h"

namespace trainctl::serve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A PNG signature and an IHDR claiming `side` x `side` RGB pixels, and nothing after it.
std::string HeaderOnlyPng(uint32_t side) {
  std::string png("\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR", 16);
  for (int i = 0; i < 2; ++i) {
    for (int shift = 24; shift >= 0; shift -= 8) png.push_back(static_cast<char>(side >> shift));
  }
  png.append("\x08\x02\0\0\0\0\0\0\0", 9);
  return png;
}

json ImagePart(const std::string& bytes) {
  return {{"type", "image_url"},
          {"image_url", {{"url", "data:image/png;base64," + absl::Base64Escape(bytes)}}}};
}

json Chat(json content, int64_t max_tokens) {
  return {{"messages", {{{"role", "user"}, {"content", std::move(content)}}}},
          {"temperature", 0},
          {"max_tokens", max_tokens}};
}

class ServeLimitsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    torch::manual_seed(0);
    auto config_path = model::FindModelConfig("tiny");
    ASSERT_TRUE(config_path.ok());
    auto config = model::LoadQwen2VLConfig(*config_path);
    ASSERT_TRUE(config.ok());
    model::Qwen2VLForConditionalGeneration tiny(*config);
    tiny.InitWeights(0.15);
    ASSERT_TRUE(model::SaveHfCheckpoint(tiny, ModelDir()).ok());
    dir_->Write("model/generation_config.json",
                R"({"eos_token_id": [151645], "pad_token_id": 151643})");
    for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
      std::error_code ec;
      fs::copy_file(data::testing::QwenTokenizerPath() + "/" + file, ModelDir() + "/" + file,
                    fs::copy_options::overwrite_existing, ec);
      ASSERT_FALSE(ec) << file << ": " << ec.message() << " (run scripts/setup.sh)";
    }
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string ModelDir() { return dir_->path() + "/model"; }

  void SetUp() override {
    auto tokenizer = tokenizer::BpeTokenizer::Load(ModelDir());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
  }

  void StartServer(const data::ImageProcessorOptions& image) {
    auto model = model::LoadHfModel(ModelDir(), torch::kFloat32);
    ASSERT_TRUE(model.ok()) << model.status();
    (*model)->eval();
    GenerationQueueOptions q;
    q.max_batch = 4;
    q.eos_token_ids = {model::kImEndTokenId};
    q.pad_token_id = model::kEndOfTextTokenId;
    queue_ = std::make_unique<GenerationQueue>(*model, q);
    OpenAiServerOptions options;
    options.limits.image = image;
    server_ = std::make_unique<OpenAiServer>(tokenizer_.get(), queue_.get(), options);
    auto port = server_->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status();
    port_ = *port;
  }

  void TearDown() override {
    server_.reset();
    queue_.reset();
  }

  httplib::Result Post(const std::string& body) {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(120, 0);
    return client.Post("/v1/chat/completions", body, "application/json");
  }

  static testing::TempDir* dir_;
  std::unique_ptr<tokenizer::BpeTokenizer> tokenizer_;
  std::unique_ptr<GenerationQueue> queue_;
  std::unique_ptr<OpenAiServer> server_;
  int port_ = 0;
};

testing::TempDir* ServeLimitsTest::dir_ = nullptr;

// Four 13000x13000 headers: 4 x 16,384 tokens at the default max_pixels, over the 32,768-token
// context, refused from the headers (the bodies hold no pixels at all). Under a max_pixels of 64
// merged tokens they fit, and the request goes on to decoding, which fails on the missing data.
TEST_F(ServeLimitsTest, HugePngHeadersAreRefusedBeforeDecoding) {
  json parts = json::array();
  for (int i = 0; i < 4; ++i) parts.push_back(ImagePart(HeaderOnlyPng(13000)));
  parts.push_back({{"type", "text"}, {"text", "Which is largest?"}});
  const std::string body = Chat(parts, 16).dump();

  StartServer({});
  const absl::Time start = absl::Now();
  auto refused = Post(body);
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
  const json error = json::parse(refused->body)["error"];
  EXPECT_EQ(error["type"], "invalid_request_error");
  EXPECT_EQ(error["param"], "messages");
  const std::string message = error["message"];
  EXPECT_NE(message.find("65536 for 4 images by their headers"), std::string::npos) << message;
  EXPECT_NE(message.find("refused before decoding or tokenizing"), std::string::npos) << message;
  std::cout << "4 x 13000x13000 headers refused in " << absl::FormatDuration(took) << ": "
            << message << "\n";

  TearDown();
  StartServer({data::kDefaultMinPixels, 28 * 28 * 64});
  auto decoded = Post(body);
  ASSERT_TRUE(decoded);
  EXPECT_EQ(decoded->status, 400) << decoded->body;
  const json decode_error = json::parse(decoded->body)["error"];
  EXPECT_EQ(decode_error["param"], "messages[0].content[0]") << decoded->body;
  EXPECT_NE(decode_error["message"].get<std::string>().find("cannot decode image"),
            std::string::npos)
      << decoded->body;
}

// 16 MiB of text is at least 16 MiB / max_token_bytes tokens: over the context, refused without
// tokenizing (the message says which check it was).
TEST_F(ServeLimitsTest, OversizedTextIsRefusedBeforeTokenizing) {
  const int64_t bytes = int64_t{16} << 20;
  std::cout << "the Qwen tokenizer's longest token: " << tokenizer_->max_token_bytes()
            << " bytes; 16 MiB of ASCII is at least " << MinTextTokens(bytes, bytes, *tokenizer_)
            << " tokens\n";
  ASSERT_GT(MinTextTokens(bytes, bytes, *tokenizer_), 32768);
  StartServer({});
  std::string text;
  text.reserve(static_cast<size_t>(bytes));
  while (static_cast<int64_t>(text.size()) < bytes) text += "The quick brown fox. ";
  const absl::Time start = absl::Now();
  auto res = Post(Chat(text, 16).dump());
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body.substr(0, 300);
  const std::string message = json::parse(res->body)["error"]["message"];
  EXPECT_NE(message.find("refused before decoding or tokenizing"), std::string::npos) << message;
  std::cout << "16 MiB of text refused in " << absl::FormatDuration(took) << ": " << message
            << "\n";
}

// The server's min_pixels reach the processor: an 84x56 picture is 3 x 2 merged tokens at the
// defaults and 5 x 4 with min_pixels 16 x 28 x 28 (smart_resize scales it up to 140 x 112).
TEST_F(ServeLimitsTest, MinPixelsDecideAnImagesTokens) {
  data::RgbImage image{84, 56, {}};
  for (int i = 0; i < 84 * 56 * 3; ++i) image.pixels.push_back(static_cast<uint8_t>(i * 37 % 251));
  const std::string png = *data::EncodePng(image);
  const std::string body =
      Chat({ImagePart(png), {{"type", "text"}, {"text", "What is it?"}}}, 2).dump();
  std::vector<int64_t> prompt_tokens;
  for (const data::ImageProcessorOptions& options :
       {data::ImageProcessorOptions{}, data::ImageProcessorOptions{16 * 28 * 28, 1 << 20}}) {
    StartServer(options);
    auto res = Post(body);
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    prompt_tokens.push_back(json::parse(res->body)["usage"]["prompt_tokens"].get<int64_t>());
    TearDown();
  }
  EXPECT_EQ(prompt_tokens[1] - prompt_tokens[0], 5 * 4 - 3 * 2);
}

// The binary: bad pixel flags exit 2 naming the flag before any model is loaded; a server started
// with --max_body_mb 1 answers a 2 MiB body with 413 and OpenAI's error object, and the model's
// preprocessor_config.json decides what the header check allows.
TEST_F(ServeLimitsTest, TrainerServeFlags) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--min_pixels", "0"}, "--min_pixels: a positive integer"},
      {{"--max_pixels", "many"}, "--max_pixels: a positive integer"},
      {{"--min_pixels", "1000", "--max_pixels", "999"},
       "--max_pixels (999) must be at least --min_pixels (1000)"},
      {{"--max_body_mb", "0"}, "--max_body_mb: an integer in [1, 4096]"},
  };
  for (const auto& [extra, expected] : bad) {
    std::vector<std::string> argv = {TRAINCTL_TRAINER_BIN, "serve",    "--model",
                                     ModelDir(),           "--listen", "127.0.0.1:0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto run = trainctl::testing::Run(argv, {}, absl::Seconds(60));
    EXPECT_EQ(run.exit_code, 2) << expected;
    EXPECT_NE(run.err.find(expected), std::string::npos) << run.err;
  }

  // The model's preprocessor_config.json sets the bounds as AutoProcessor reads them (size's
  // longest_edge here; the flags would override it).
  dir_->Write("model/preprocessor_config.json",
              json{{"size", {{"shortest_edge", 3136}, {"longest_edge", 28 * 28 * 256}}}}.dump());
  const std::string log = dir_->path() + "/serve-limits.log";
  trainctl::testing::Subprocess serve({TRAINCTL_TRAINER_BIN, "serve", "--model", ModelDir(),
                                       "--listen", "127.0.0.1:0", "--max_body_mb", "1"},
                                      log);
  ASSERT_TRUE(trainctl::testing::WaitFor(
      [&] {
        const std::string text = trainctl::testing::ReadFileOrEmpty(log);
        const size_t at = text.find("http://127.0.0.1:");
        if (at == std::string::npos || text.find('\n', at) == std::string::npos) return false;
        port_ = std::stoi(text.substr(at + 17));
        return true;
      },
      absl::Seconds(60)))
      << trainctl::testing::ReadFileOrEmpty(log);
  auto big = Post(Chat(std::string(size_t{2} << 20, 'a'), 2).dump());
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  EXPECT_EQ(json::parse(big->body)["error"]["type"], "invalid_request_error") << big->body;
  // 16 headers of 13000x13000 at 256 tokens each under longest_edge: 4,096 tokens, and with
  // 30,000 new ones over the 32,768-token context.
  json parts = json::array();
  for (int i = 0; i < 16; ++i) parts.push_back(ImagePart(HeaderOnlyPng(13000)));
  auto res = Post(Chat(parts, 30000).dump());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  const std::string message = json::parse(res->body)["error"]["message"];
  EXPECT_NE(message.find("4096 for 16 images by their headers"), std::string::npos) << message;
  serve.Kill(SIGTERM);
  auto code = serve.Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0) << trainctl::testing::ReadFileOrEmpty(log);
}

}  // namespace
}  // namespace trainctl::serve
