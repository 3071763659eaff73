// `trainctl-trainer serve` on the tiny model with the real Qwen tokenizer: OpenAI's Node client
// (tests/serve/chat_client.cjs) asks about a PNG sent as a data: URL and gets model::Generate's
// greedy tokens for the prompt `trainctl prepare` builds from the same chat; /v1/models; n with a
// seed; max_tokens and finish_reason; OpenAI error objects for bad requests; concurrent requests
// batched together with the tokens each gets alone; continuous batching (a short request finishes
// while a long one generates, rows joining a running batch decode as alone); a client going away
// cancels its rows; slow clients do not starve the server; the verb's binary (request timeout,
// graceful SIGTERM).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/data/batch.h"
#include "common/data/image_processor.h"
#include "common/data/prepare.h"
#include "nlohmann/json.hpp"
#include "tests/data/qwen_tokenizer.h"
#include "tests/testing/raw_socket.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "worker/trainer/model/generation.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/model/state_dict_adapter.h"
#include "worker/trainer/serve/generation_queue.h"
#include "worker/trainer/serve/openai_server.h"
#include "worker/trainer/serve/running_batch.h"

namespace trainctl::serve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Tokens = std::vector<int64_t>;

constexpr char kModelName[] = "tiny-vl";

class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    torch::manual_seed(0);
    auto config_path = model::FindModelConfig("tiny");
    ASSERT_TRUE(config_path.ok());
    auto config = model::LoadQwen2VLConfig(*config_path);
    ASSERT_TRUE(config.ok());
    model::Qwen2VLForConditionalGeneration tiny(*config);
    tiny.InitWeights(0.15);  // peaked logits: no near-ties in the argmax chains
    ASSERT_TRUE(model::SaveHfCheckpoint(tiny, ModelDir()).ok());
    dir_->Write("model/generation_config.json",
                R"({"eos_token_id": [151645], "pad_token_id": 151643})");
    for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
      std::error_code ec;
      fs::copy_file(data::testing::QwenTokenizerPath() + "/" + file, ModelDir() + "/" + file,
                    fs::copy_options::overwrite_existing, ec);
      ASSERT_FALSE(ec) << file << ": " << ec.message() << " (run scripts/setup.sh)";
    }
    data::RgbImage image{56, 84, {}};
    for (int i = 0; i < 56 * 84 * 3; ++i)
      image.pixels.push_back(static_cast<uint8_t>(i * 37 % 251));
    png_ = new std::string(*data::EncodePng(image));
    dir_->Write("images/cat.png", *png_);
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete png_;
  }
  static std::string ModelDir() { return dir_->path() + "/model"; }

  void SetUp() override {
    auto tokenizer = tokenizer::BpeTokenizer::Load(ModelDir());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
    reference_ = LoadModel();
  }

  static std::shared_ptr<model::Qwen2VLForConditionalGeneration> LoadModel() {
    auto model = model::LoadHfModel(ModelDir(), torch::kFloat32);
    EXPECT_TRUE(model.ok()) << model.status();
    (*model)->eval();
    return *model;
  }

  // A server on a free port, over its own copy of the model.
  void StartServer(int64_t max_batch, absl::Duration window) {
    GenerationQueueOptions q;
    q.max_batch = max_batch;
    q.batch_window = window;
    q.eos_token_ids = {model::kImEndTokenId};
    q.pad_token_id = model::kEndOfTextTokenId;
    queue_ = std::make_unique<GenerationQueue>(LoadModel(), q);
    OpenAiServerOptions options;
    options.model_name = kModelName;
    options.limits.image_root = dir_->path() + "/images";
    options.read_timeout = read_timeout_;
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

  // Greedy tokens of model::Generate for one prompt alone.
  Tokens GenerateAlone(const ChatPrompt& prompt, int64_t max_new_tokens) {
    auto inputs = model::LeftPadPrompts({prompt.ids}, model::kEndOfTextTokenId);
    EXPECT_TRUE(inputs.ok());
    if (!prompt.grid_thw.empty()) {
      const int64_t patches = static_cast<int64_t>(prompt.pixel_values.size()) / data::kPatchDim;
      inputs->pixel_values =
          torch::tensor(prompt.pixel_values, torch::kFloat32).view({patches, data::kPatchDim});
      inputs->image_grid_thw = torch::tensor(prompt.grid_thw, torch::kInt64).view({-1, 3});
    }
    model::GenerationOptions options;
    options.temperature = 0;
    options.max_new_tokens = max_new_tokens;
    options.eos_token_ids = {model::kImEndTokenId};
    options.pad_token_id = model::kEndOfTextTokenId;
    auto out = model::Generate(*reference_, *inputs, options);
    EXPECT_TRUE(out.ok()) << out.status();
    return out->tokens[0];
  }

  // The port a `serve` process logging to `log` listens on, once it says; 0 after 60 s.
  static int WaitForPort(const std::string& log) {
    int port = 0;
    trainctl::testing::WaitFor(
        [&] {
          const std::string text = trainctl::testing::ReadFileOrEmpty(log);
          const size_t at = text.find("http://127.0.0.1:");
          if (at == std::string::npos || text.find('\n', at) == std::string::npos) return false;
          port = std::stoi(text.substr(at + 17));
          return true;
        },
        absl::Seconds(60));
    return port;
  }

  static json TextChat(const std::string& text, int64_t max_tokens) {
    return {{"model", kModelName},
            {"messages", {{{"role", "user"}, {"content", text}}}},
            {"temperature", 0},
            {"max_tokens", max_tokens}};
  }

  static testing::TempDir* dir_;
  static std::string* png_;
  std::unique_ptr<tokenizer::BpeTokenizer> tokenizer_;
  std::shared_ptr<model::Qwen2VLForConditionalGeneration> reference_;
  std::unique_ptr<GenerationQueue> queue_;
  std::unique_ptr<OpenAiServer> server_;
  int port_ = 0;
  absl::Duration read_timeout_ = absl::Seconds(30);
};

testing::TempDir* ServeTest::dir_ = nullptr;
std::string* ServeTest::png_ = nullptr;

// The prompt is prepare's (data::BuildSample: the tokens before the first trained one, and the
// same patches), and the answer's tokens are Generate's on it.
TEST_F(ServeTest, OpenAiClientGetsGenerateGreedyTokens) {
  const std::string node = TRAINCTL_NODE_BIN;
  ASSERT_FALSE(node.empty()) << "node was not found when CMake configured (run scripts/setup.sh)";
  StartServer(16, absl::Milliseconds(2));
  const std::string question = "What shape is in the picture?";
  const std::string record = json{
      {"messages",
       {{{"role", "user"},
         {"content", {{{"type", "image"}}, {{"type", "text"}, {"text", question}}}}},
        {{"role", "assistant"}, {"content", "x"}}}},
      {"images", {"cat.png"}}}.dump();
  auto parsed = data::ParseRecord(record);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto sample = data::BuildSample(*parsed, dir_->path() + "/images", {}, *tokenizer_);
  ASSERT_TRUE(sample.ok()) << sample.status();
  ChatPrompt prepared;
  for (size_t i = 0; i < sample->labels.size() && sample->labels[i] < 0; ++i) {
    prepared.ids.push_back(sample->input_ids[i]);
  }
  prepared.pixel_values = sample->pixel_values;
  for (const auto& g : sample->image_grid_thw)
    prepared.grid_thw.insert(prepared.grid_thw.end(), g.begin(), g.end());
  const Tokens expected = GenerateAlone(prepared, 8);

  const std::string png_path = dir_->Write("client/cat.png", *png_);
  const auto run = trainctl::testing::Run(
      {node, TRAINCTL_SOURCE_DIR "/tests/serve/chat_client.cjs",
       TRAINCTL_SOURCE_DIR "/.fixtures/npm/node_modules",
       absl::StrCat("http://127.0.0.1:", port_, "/v1"), kModelName, png_path, question, "8"},
      {}, absl::Seconds(120));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json answer = json::parse(run.out);
  EXPECT_EQ(answer["token_ids"].get<Tokens>(), expected);
  Tokens shown = expected;
  if (!shown.empty() && shown.back() == model::kImEndTokenId) shown.pop_back();
  std::vector<int32_t> ids;
  for (int64_t t : shown)
    if (t < tokenizer_->vocab_size()) ids.push_back(static_cast<int32_t>(t));
  EXPECT_EQ(answer["text"], *tokenizer_->Decode(ids, true));
  EXPECT_EQ(answer["finish_reason"],
            expected.size() == 8 && expected.back() != model::kImEndTokenId ? "length" : "stop");
  EXPECT_EQ(answer["usage"]["prompt_tokens"], prepared.ids.size());
  EXPECT_EQ(answer["usage"]["completion_tokens"], expected.size());
  EXPECT_EQ(answer["model"], kModelName);
  EXPECT_EQ(answer["models"], json::array({kModelName}));
  EXPECT_EQ(answer["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  std::cout << "openai client got: " << run.out;
}

TEST_F(ServeTest, ModelsChoicesSeedsAndLength) {
  StartServer(16, absl::Milliseconds(2));
  httplib::Client client("127.0.0.1", port_);
  auto models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  ASSERT_EQ(models->status, 200);
  const json list = json::parse(models->body);
  EXPECT_EQ(list["object"], "list");
  EXPECT_EQ(list["data"][0]["id"], kModelName);

  json sampled = TextChat("Tell me a story.", 6);
  sampled["n"] = 2;
  sampled["temperature"] = 1.0;
  sampled["seed"] = 1234;
  auto first = Post(sampled.dump());
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200) << first->body;
  const json a = json::parse(first->body);
  ASSERT_EQ(a["choices"].size(), 2u);
  EXPECT_EQ(a["choices"][0]["index"], 0);
  EXPECT_EQ(a["choices"][1]["index"], 1);
  EXPECT_NE(a["choices"][0]["token_ids"], a["choices"][1]["token_ids"]);
  EXPECT_EQ(a["object"], "chat.completion");
  EXPECT_TRUE(a["created"].is_number_integer());
  auto again = Post(sampled.dump());  // the same seed: the same choices
  ASSERT_TRUE(again);
  EXPECT_EQ(json::parse(again->body)["choices"], a["choices"]);

  auto cut = Post(TextChat("Count to ten.", 3).dump());
  ASSERT_TRUE(cut);
  ASSERT_EQ(cut->status, 200) << cut->body;
  const json c = json::parse(cut->body);
  EXPECT_EQ(c["choices"][0]["token_ids"].size(), 3u);
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(c["usage"]["completion_tokens"], 3);
  EXPECT_EQ(c["usage"]["total_tokens"], c["usage"]["prompt_tokens"].get<int64_t>() + 3);
}

TEST_F(ServeTest, BadRequestsGetOpenAiErrors) {
  StartServer(16, absl::Milliseconds(2));
  json unknown_role = TextChat("hi", 2);
  unknown_role["messages"][0]["role"] = "wizard";
  json bad_image = TextChat("hi", 2);
  bad_image["messages"][0]["content"] = {
      {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,iVBORw0KGgoAAAA"}}}},
      {{"type", "text"}, {"text", "what?"}}};
  json bad_base64 = bad_image;
  bad_base64["messages"][0]["content"][0]["image_url"]["url"] = "data:image/png;base64,@@@";
  json web_image = bad_image;
  web_image["messages"][0]["content"][0]["image_url"]["url"] = "https://example.com/a.png";
  json escaping = bad_image;
  escaping["messages"][0]["content"][0]["image_url"]["url"] = "file://../model/config.json";
  json stream = TextChat("hi", 2);
  stream["stream"] = true;
  json zero_n = TextChat("hi", 2);
  zero_n["n"] = 0;
  json hot = TextChat("hi", 2);
  hot["temperature"] = 7;
  const std::vector<std::pair<std::string, json>> cases = {
      {"{\"messages\": [", nullptr},
      {"[1, 2]", nullptr},
      {R"({"model": "tiny-vl"})", "messages"},
      {unknown_role.dump(), "messages[0].role"},
      {bad_image.dump(), "messages[0].content[0]"},
      {bad_base64.dump(), "messages[0].content[0]"},
      {web_image.dump(), "messages[0].content[0]"},
      {escaping.dump(), "messages[0].content[0]"},
      {stream.dump(), "stream"},
      {zero_n.dump(), "n"},
      {hot.dump(), "temperature"},
      // A number past double's range names its field (it was "the body is not a JSON object").
      {R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e400})", "max_tokens"},
  };
  for (const auto& [body, param] : cases) {
    auto res = Post(body);
    ASSERT_TRUE(res) << body;
    EXPECT_EQ(res->status, 400) << body << " -> " << res->body;
    const json error = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(error.contains("error")) << res->body;
    EXPECT_EQ(error["error"]["type"], "invalid_request_error") << res->body;
    EXPECT_FALSE(error["error"]["message"].get<std::string>().empty());
    EXPECT_EQ(error["error"]["param"], param) << res->body;
    EXPECT_TRUE(error["error"].contains("code"));
    // The field is named once in the message, not twice ("p: p: ...").
    if (param.is_string()) {
      const std::string message = error["error"]["message"];
      const std::string twice = param.get<std::string>() + ": " + param.get<std::string>() + ": ";
      EXPECT_EQ(message.find(twice), std::string::npos) << message;
      EXPECT_EQ(message.rfind(param.get<std::string>(), 0), 0u) << message;
    }
  }
  json other_model = TextChat("hi", 2);
  other_model["model"] = "gpt-4o";
  auto wrong = Post(other_model.dump());
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 404);
  EXPECT_EQ(json::parse(wrong->body)["error"]["code"], "model_not_found");
  httplib::Client client("127.0.0.1", port_);
  auto nowhere = client.Get("/v1/nothing");
  ASSERT_TRUE(nowhere);
  EXPECT_EQ(nowhere->status, 404);
  EXPECT_TRUE(json::parse(nowhere->body).contains("error"));
  // The server still answers.
  auto fine = Post(TextChat("hi", 2).dump());
  ASSERT_TRUE(fine);
  EXPECT_EQ(fine->status, 200) << fine->body;
}

// A temperature inside OpenAI's range but too small to divide logits by (1e-40 overflowed to a
// LibTorch error) is greedy.
TEST_F(ServeTest, TinyTemperatureIsGreedy) {
  StartServer(16, absl::Milliseconds(2));
  json chat = TextChat("Tell me a story.", 6);
  auto greedy = Post(chat.dump());
  chat["temperature"] = 1e-40;
  auto tiny = Post(chat.dump());
  ASSERT_TRUE(greedy && tiny);
  ASSERT_EQ(tiny->status, 200) << tiny->body;
  EXPECT_EQ(json::parse(tiny->body)["choices"][0]["token_ids"],
            json::parse(greedy->body)["choices"][0]["token_ids"]);
}

// The model throwing (here on an id outside its vocabulary; in production LibTorch or allocator
// errors) is the server's failure, INTERNAL (500 server_error), not the client's INVALID_ARGUMENT.
TEST_F(ServeTest, ModelErrorsAreInternal) {
  GenerationQueue queue(LoadModel(), GenerationQueueOptions{});
  auto prompt = std::make_shared<ChatPrompt>();
  prompt->ids = {reference_->config().vocab_size + 5};
  SamplingParams sampling;
  sampling.max_tokens = 2;
  auto result = queue.Submit(prompt, sampling).get();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal) << result.status();
  EXPECT_NE(result.status().message().find("input_ids"), std::string::npos) << result.status();
  // The queue still serves.
  prompt = std::make_shared<ChatPrompt>();
  prompt->ids = {1, 2, 3};
  auto fine = queue.Submit(prompt, sampling).get();
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ((*fine)[0].tokens.size(), 2u);
}

// Four clients at once, max_batch 4, a batch window long enough for all to arrive: one Generate
// call of 4 rows (the queue's counters say so), and each answer is what its prompt gets alone.
TEST_F(ServeTest, ConcurrentRequestsAreBatched) {
  StartServer(4, absl::Seconds(5));
  const std::vector<std::string> questions = {"Hello there.", "What is 2 + 2?",
                                              "Name a colour, please, quickly.", "Why?"};
  std::vector<Tokens> expected;
  for (const std::string& q : questions) {
    auto request = ParseChatRequest(TextChat(q, 6).dump(), {});
    ASSERT_TRUE(request.ok());
    auto prompt = BuildChatPrompt(*request, *tokenizer_, {});
    ASSERT_TRUE(prompt.ok());
    expected.push_back(GenerateAlone(*prompt, 6));
  }
  std::vector<json> answers(questions.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < questions.size(); ++i) {
    clients.emplace_back([&, i] {
      auto res = Post(TextChat(questions[i], 6).dump());
      if (res && res->status == 200) answers[i] = json::parse(res->body);
    });
  }
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < questions.size(); ++i) {
    ASSERT_FALSE(answers[i].is_null()) << "request " << i << " failed";
    EXPECT_EQ(answers[i]["choices"][0]["token_ids"].get<Tokens>(), expected[i]) << questions[i];
  }
  const QueueStats stats = queue_->stats();
  EXPECT_EQ(stats.generate_calls, 1);
  EXPECT_EQ(stats.largest_batch, 4);
  EXPECT_EQ(stats.rows, 4);
}

// Continuous batching: a request of 16 choices of 30,000 tokens is decoding when a 4-token request
// arrives; the short one joins the running batch and is answered while the long one still
// generates (it held the only model thread until its end before). The long request's rows take 12
// of the 16 slots: the last quarter is for requests with no row running, so a large n cannot fill
// the batch. Stopping the server then ends the long one at once with 503 "the server is shutting
// down".
TEST_F(ServeTest, ShortRequestFinishesWhileLongOneGenerates) {
  StartServer(16, absl::Milliseconds(2));
  std::atomic<bool> long_done{false};
  std::optional<httplib::Result> long_result;
  std::thread long_client([&] {
    json chat = TextChat("Count to a million, please.", 30000);
    chat["n"] = 16;
    long_result.emplace(Post(chat.dump()));
    long_done = true;
  });
  ASSERT_TRUE(trainctl::testing::WaitFor([&] { return queue_->stats().decode_steps >= 2; },
                                         absl::Seconds(60)));
  auto request = ParseChatRequest(TextChat("Why?", 4).dump(), {});
  ASSERT_TRUE(request.ok());
  auto prompt = BuildChatPrompt(*request, *tokenizer_, {});
  ASSERT_TRUE(prompt.ok());
  auto shorter = Post(TextChat("Why?", 4).dump());
  ASSERT_TRUE(shorter);
  ASSERT_EQ(shorter->status, 200) << shorter->body;
  EXPECT_FALSE(long_done.load());
  EXPECT_TRUE(
      trainctl::testing::WaitFor([&] { return queue_->running_rows() == 12; }, absl::Seconds(10)));
  EXPECT_FALSE(long_done.load());
  EXPECT_EQ(json::parse(shorter->body)["choices"][0]["token_ids"].get<Tokens>(),
            GenerateAlone(*prompt, 4));
  const QueueStats stats = queue_->stats();
  EXPECT_EQ(stats.generate_calls, 2);
  EXPECT_EQ(stats.largest_batch, 13);
  EXPECT_EQ(queue_->queued_rows(), 4);  // the long request's last 4 rows

  const auto stop_start = std::chrono::steady_clock::now();
  server_->Stop();
  long_client.join();
  EXPECT_LT(std::chrono::steady_clock::now() - stop_start, std::chrono::seconds(5));
  ASSERT_TRUE(long_result && *long_result);
  EXPECT_EQ((*long_result)->status, 503) << (*long_result)->body;
  const json error = json::parse((*long_result)->body);
  EXPECT_EQ(error["error"]["type"], "server_error");
  EXPECT_EQ(error["error"]["message"], "the server is shutting down");
}

// Rows joining a running batch decode as they would alone: B's prompt is longer than A's cache
// when it joins (A's rows move right in the merged cache), and once B leaves, A's columns are cut
// from the left (the cache compacts). Both answers are model::Generate's alone.
TEST_F(ServeTest, RowsJoiningMidwayDecodeAsAlone) {
  StartServer(16, absl::Milliseconds(2));
  std::string story;
  for (int i = 0; i < 24; ++i) story += "The quick brown fox jumps over the lazy dog. ";
  const json a = TextChat("Hi", 300), b = TextChat(story + "What did the fox do?", 5);
  std::vector<Tokens> expected;
  for (const json& chat : {a, b}) {
    auto request = ParseChatRequest(chat.dump(), {});
    ASSERT_TRUE(request.ok());
    auto prompt = BuildChatPrompt(*request, *tokenizer_, {});
    ASSERT_TRUE(prompt.ok());
    expected.push_back(GenerateAlone(*prompt, chat["max_tokens"].get<int64_t>()));
  }
  ASSERT_EQ(expected[0].size(), 300u) << "A should not stop early, or B could not join it";
  std::optional<httplib::Result> first;
  std::thread a_client([&] { first.emplace(Post(a.dump())); });
  ASSERT_TRUE(trainctl::testing::WaitFor([&] { return queue_->stats().decode_steps >= 2; },
                                         absl::Seconds(60)));
  auto second = Post(b.dump());
  a_client.join();
  ASSERT_TRUE(first && *first && second);
  ASSERT_EQ((*first)->status, 200) << (*first)->body;
  ASSERT_EQ(second->status, 200) << second->body;
  EXPECT_EQ(json::parse(second->body)["choices"][0]["token_ids"].get<Tokens>(), expected[1]);
  EXPECT_EQ(json::parse((*first)->body)["choices"][0]["token_ids"].get<Tokens>(), expected[0]);
  EXPECT_EQ(queue_->stats().largest_batch, 2) << "B did not join while A was decoding";
}

// RunningBatch itself, step by step: A decodes 3 steps, then B joins with a prompt longer than
// A's cache (A's row moves right), B leaves after its 4 tokens (A's columns are cut from the left)
// and A goes on. Both rows' greedy tokens are Generate's for each prompt alone.
TEST_F(ServeTest, RunningBatchMergesShiftsAndCompacts) {
  auto a = std::make_shared<ChatPrompt>(), b = std::make_shared<ChatPrompt>();
  for (int64_t i = 0; i < 5; ++i) a->ids.push_back(100 + 7 * i);
  for (int64_t i = 0; i < 40; ++i) b->ids.push_back(300 + 11 * i);
  const Tokens alone_a = GenerateAlone(*a, 30), alone_b = GenerateAlone(*b, 4);
  ASSERT_EQ(alone_a.size(), 30u);
  ASSERT_EQ(alone_b.size(), 4u);
  RunningBatch batch(LoadModel(), {model::kImEndTokenId}, model::kEndOfTextTokenId);
  ASSERT_TRUE(batch.Join({NewRow{a, 0, 1, 30, 0}}).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(batch.Step().ok());
  ASSERT_EQ(batch.cache_length(), 8);  // 5 prompt tokens and 3 fed
  ASSERT_TRUE(batch.Join({NewRow{b, 0, 1, 4, 0}}).ok());
  EXPECT_EQ(batch.cache_length(), 40);  // A moved right by 32
  EXPECT_EQ(batch.rows()[0].first, 32);
  while (!batch.rows()[1].finished) ASSERT_TRUE(batch.Step().ok());
  EXPECT_EQ(batch.rows()[1].tokens, alone_b);
  batch.Retain({true, false});
  EXPECT_EQ(batch.rows()[0].first, 0);  // the 32 columns before A were cut
  EXPECT_EQ(batch.cache_length(), 43 - 32);
  while (!batch.rows()[0].finished) ASSERT_TRUE(batch.Step().ok());
  EXPECT_EQ(batch.rows()[0].tokens, alone_a);
}

// A client that goes away mid-generation: its rows leave the batch at the next step instead of
// generating to max_tokens for nobody.
TEST_F(ServeTest, ClientDisconnectCancelsItsRows) {
  StartServer(16, absl::Milliseconds(2));
  const std::string body = TextChat("Count to a million, please.", 30000).dump();
  {
    trainctl::testing::RawSocket socket(port_);
    ASSERT_TRUE(socket.connected());
    ASSERT_TRUE(socket.Send(absl::StrCat(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n",
        "Content-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n", body)));
    ASSERT_TRUE(trainctl::testing::WaitFor([&] { return queue_->stats().decode_steps >= 2; },
                                           absl::Seconds(60)));
  }  // closed
  ASSERT_TRUE(
      trainctl::testing::WaitFor([&] { return queue_->running_rows() == 0; }, absl::Seconds(10)));
  EXPECT_EQ(queue_->stats().cancelled_rows, 1);
}

// 24 connections that sent one header byte and then nothing held all 8 HTTP threads: nothing
// else was answered until they timed out. They take a thread each from a larger pool now.
TEST_F(ServeTest, SlowClientsDoNotStarveTheServer) {
  StartServer(16, absl::Milliseconds(2));
  const auto start = std::chrono::steady_clock::now();  // connecting is prompt too (backlog)
  std::vector<std::unique_ptr<trainctl::testing::RawSocket>> slow;
  for (int i = 0; i < 24; ++i) {
    slow.push_back(std::make_unique<trainctl::testing::RawSocket>(port_));
    ASSERT_TRUE(slow.back()->connected());
    ASSERT_TRUE(slow.back()->Send("P"));
  }
  httplib::Client client("127.0.0.1", port_);
  client.set_connection_timeout(2);
  client.set_read_timeout(2);
  auto models = client.Get("/v1/models");
  ASSERT_TRUE(models) << httplib::to_string(models.error());
  EXPECT_EQ(models->status, 200);
  auto answer = client.Post("/v1/chat/completions", TextChat("hi", 2).dump(), "application/json");
  ASSERT_TRUE(answer) << httplib::to_string(answer.error());
  EXPECT_EQ(answer->status, 200) << answer->body;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

// A body dribbled a byte at a time is cut off read_timeout after the request's first byte (each
// byte restarted cpp-httplib's own timeout, so it held its thread for as long as it dribbled).
TEST_F(ServeTest, DribbledBodyIsCutOffAtTheReadTimeout) {
  read_timeout_ = absl::Milliseconds(500);
  StartServer(16, absl::Milliseconds(2));
  trainctl::testing::RawSocket socket(port_);
  ASSERT_TRUE(socket.connected());
  ASSERT_TRUE(
      socket.Send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                  "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"));
  const auto start = std::chrono::steady_clock::now();
  bool closed = false;
  for (int i = 0; i < 50 && !closed; ++i) {  // a byte every 100 ms, for up to 5 s
    socket.Send(" ");
    closed = socket.ClosedByPeer(100);
  }
  EXPECT_TRUE(closed);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

// The binary's request timeout: a request still generating at --request_timeout_s ends with 504
// server_error, code "timeout", saying how far it got.
TEST_F(ServeTest, TrainerServeRequestTimeout) {
  const std::string log = dir_->path() + "/serve_timeout.log";
  trainctl::testing::Subprocess serve({TRAINCTL_TRAINER_BIN, "serve", "--model", ModelDir(),
                                       "--listen", "127.0.0.1:0", "--request_timeout_s", "1"},
                                      log);
  const int port = WaitForPort(log);
  ASSERT_GT(port, 0) << trainctl::testing::ReadFileOrEmpty(log);
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(30, 0);
  const auto start = std::chrono::steady_clock::now();
  json chat = TextChat("Count to a million.", 30000);
  chat.erase("model");  // the binary serves "model", its directory's name
  auto res = client.Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(res->status, 504) << res->body;
  const json error = json::parse(res->body);
  EXPECT_EQ(error["error"]["type"], "server_error");
  EXPECT_EQ(error["error"]["code"], "timeout");
  EXPECT_NE(error["error"]["message"].get<std::string>().find("request timeout"),
            std::string::npos);
  serve.Kill(SIGTERM);
  ASSERT_TRUE(serve.Wait(absl::Seconds(10)).ok());
}

// SIGTERM while a 30,000-token request generates: the server stops accepting, the request ends
// at once with 503 "the server is shutting down", and the process exits 0 within seconds (it
// used to finish the generation first).
TEST_F(ServeTest, TrainerServeSigtermEndsRequestsInFlight) {
  const std::string log = dir_->path() + "/serve_sigterm.log";
  trainctl::testing::Subprocess serve(
      {TRAINCTL_TRAINER_BIN, "serve", "--model", ModelDir(), "--listen", "127.0.0.1:0"}, log);
  const int port = WaitForPort(log);
  ASSERT_GT(port, 0) << trainctl::testing::ReadFileOrEmpty(log);
  std::optional<httplib::Result> result;
  std::thread long_client([&] {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(120, 0);
    json chat = TextChat("Count to a million.", 30000);
    chat.erase("model");  // the binary serves "model", its directory's name
    result.emplace(client.Post("/v1/chat/completions", chat.dump(), "application/json"));
  });
  httplib::Client probe("127.0.0.1", port);
  ASSERT_TRUE(trainctl::testing::WaitFor(
      [&] {
        auto health = probe.Get("/health");
        return health && health->status == 200 &&
               json::parse(health->body)["running_rows"].get<int64_t>() == 1;
      },
      absl::Seconds(60)));
  const auto start = std::chrono::steady_clock::now();
  serve.Kill(SIGTERM);
  auto code = serve.Wait(absl::Seconds(10));
  long_client.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << trainctl::testing::ReadFileOrEmpty(log);
  ASSERT_TRUE(result && *result) << (result ? httplib::to_string(result->error()) : "no result");
  EXPECT_EQ((*result)->status, 503) << (*result)->body;
  EXPECT_EQ(json::parse((*result)->body)["error"]["message"], "the server is shutting down");
}

// The verb itself: listens on a free port, lists its model, stops on SIGTERM with exit code 0.
TEST_F(ServeTest, TrainerServeVerb) {
  const std::string log = dir_->path() + "/serve.log";
  trainctl::testing::Subprocess serve({TRAINCTL_TRAINER_BIN, "serve", "--model", ModelDir(),
                                       "--listen", "127.0.0.1:0", "--max_batch", "4"},
                                      log);
  int port = 0;
  ASSERT_TRUE(trainctl::testing::WaitFor(
      [&] {
        const std::string text = trainctl::testing::ReadFileOrEmpty(log);
        const size_t at = text.find("http://127.0.0.1:");
        if (at == std::string::npos || text.find('\n', at) == std::string::npos) return false;
        port = std::stoi(text.substr(at + 17));
        return true;
      },
      absl::Seconds(60)))
      << trainctl::testing::ReadFileOrEmpty(log);
  httplib::Client client("127.0.0.1", port);
  auto models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "model");
  serve.Kill(SIGTERM);
  auto code = serve.Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0) << trainctl::testing::ReadFileOrEmpty(log);
}

}  // namespace
}  // namespace trainctl::serve
