// The endpoint teacher against the real `trainctl-trainer serve` on the tiny model (a one-step
// SFT checkpoint with the real Qwen tokenizer): its greedy and seeded sampled completions, for
// prompts with the shapes set's PNGs, equal what the server answers the same request made
// directly.
#include <httplib.h>
#include <signal.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/tokenizer/qwen_fixture.h"
#include "tests/trainer/shapes_fixture.h"
#include "worker/trainer/stages/internal/endpoint_teacher.h"

namespace trainctl::trainer::internal {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tokenizer::ChatPart;

class EndpointTeacherServeTest : public testing::ShapesTrainingTest {
 protected:
  void SetUp() override {
    testing::ShapesTrainingTest::SetUp();
    // A model directory: one SFT step of the tiny config, with the tokenizer beside it.
    testing::RunResult r = testing::Run(
        TrainArgs(WriteSpec("m", dir_.path() + "/m", {{"max_steps", 1}, {"save_steps", 1}}),
                  dir_.path() + "/m.jsonl"),
        {}, absl::Minutes(5));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    model_ = dir_.path() + "/m/checkpoint-1";
    for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
      std::error_code ec;
      fs::copy_file(tokenizer::testing::QwenTokenizerDir() + "/" + file, model_ + "/" + file,
                    fs::copy_options::overwrite_existing, ec);
      ASSERT_FALSE(ec) << file << ": " << ec.message();
    }
    dir_.Write("m/checkpoint-1/generation_config.json",
               R"({"eos_token_id": [151645], "pad_token_id": 151643})");

    const std::string log = dir_.path() + "/serve.log";
    serve_ = std::make_unique<testing::Subprocess>(
        std::vector<std::string>{TRAINCTL_TRAINER_BIN, "serve", "--model", model_, "--listen",
                                 "127.0.0.1:0", "--max_batch", "8"},
        log);
    ASSERT_TRUE(testing::WaitFor(
        [&] {
          const std::string text = testing::ReadFileOrEmpty(log);
          const size_t at = text.find("http://127.0.0.1:");
          if (at == std::string::npos || text.find('\n', at) == std::string::npos) return false;
          port_ = std::stoi(text.substr(at + 17));
          return true;
        },
        absl::Seconds(60)))
        << testing::ReadFileOrEmpty(log);
  }
  void TearDown() override {
    if (serve_ == nullptr) return;
    serve_->Kill(SIGTERM);
    EXPECT_TRUE(serve_->Wait(absl::Seconds(30)).ok());
  }

  // The shapes set's question k with its image.
  TeacherPrompt ShapesPrompt(int64_t index, int k) {
    const std::string image =
        absl::StrCat(dir_.path(), "/shapes/images/shape-", absl::StrFormat("%06d", k), ".png");
    TeacherPrompt p;
    p.index = index;
    p.messages = {{"system", {ChatPart::Text("Answer inside <answer></answer>.")}},
                  {"user", {ChatPart::Image(0), ChatPart::Text(absl::StrCat("Question ", k))}}};
    p.images = {image};
    return p;
  }

  // What the server answers this body posted directly: the choices' contents.
  std::vector<std::string> Direct(const json& body) {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(120, 0);
    auto res = client.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(res);
    if (!res) return {};
    EXPECT_EQ(res->status, 200) << res->body;
    std::vector<std::string> texts;
    const json answer = json::parse(res->body);
    for (const json& choice : answer["choices"]) {
      texts.push_back(choice["message"]["content"].get<std::string>());
    }
    return texts;
  }

  json DirectBody(const TeacherPrompt& p, const TeacherSampling& s) {
    std::string bytes = testing::ReadFileOrEmpty(p.images[0]);
    json image = {{"type", "image_url"},
                  {"image_url",
                   {{"url", absl::StrCat("data:image/png;base64,", absl::Base64Escape(bytes))}}}};
    return {{"messages",
             {{{"role", "system"}, {"content", p.messages[0].content[0].text}},
              {{"role", "user"},
               {"content", {image, {{"type", "text"}, {"text", p.messages[1].content[1].text}}}}}}},
            {"n", s.n},
            {"temperature", s.temperature},
            {"top_p", s.top_p},
            {"max_tokens", s.max_tokens},
            {"seed", EndpointRequestSeed(s.seed, p.index, 0)}};
  }

  std::string model_;
  std::unique_ptr<testing::Subprocess> serve_;
  int port_ = 0;
};

TEST_F(EndpointTeacherServeTest, CompletionsEqualTheServersOwnAnswers) {
  EndpointTeacherOptions options;
  options.base_url = absl::StrCat("http://127.0.0.1:", port_, "/v1");
  options.concurrency = 3;
  options.timeout_seconds = 120;
  options.backoff_initial_seconds = 0.1;
  auto teacher = MakeEndpointTeacher(options);  // the model's name from GET /v1/models
  ASSERT_TRUE(teacher.ok()) << teacher.status();
  EXPECT_EQ(json::parse((*teacher)->DescribeJson())["model"], "checkpoint-1");

  std::vector<TeacherPrompt> prompts;
  for (int k = 0; k < 5; ++k) prompts.push_back(ShapesPrompt(20 + k, k));
  TeacherSampling greedy;
  greedy.n = 2;
  greedy.temperature = 0;
  greedy.max_tokens = 12;
  TeacherSampling sampled = greedy;
  sampled.temperature = 1.0;
  sampled.top_p = 0.95;
  sampled.seed = 1234;
  // Greedy rows batched with others (three in flight) get what they get alone; sampled rows are
  // compared one request at a time (the direct request's batch then has the same rows).
  options.concurrency = 1;
  auto serial = MakeEndpointTeacher(options);
  ASSERT_TRUE(serial.ok()) << serial.status();
  for (const TeacherSampling& sampling : {greedy, sampled}) {
    Teacher& t = sampling.temperature == 0 ? **teacher : **serial;
    auto answers = t.Complete(prompts, sampling);
    ASSERT_TRUE(answers.ok()) << answers.status();
    ASSERT_EQ(answers->size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      const TeacherAnswer& a = (*answers)[i];
      EXPECT_EQ(a.index, prompts[i].index);
      EXPECT_GT(a.prompt_tokens, 0);
      std::vector<std::string> texts;
      for (const TeacherCompletion& c : a.completions) {
        texts.push_back(c.text);
        EXPECT_TRUE(c.finish_reason == "stop" || c.finish_reason == "length") << c.finish_reason;
        EXPECT_GT(c.completion_tokens, 0);
        EXPECT_LE(c.completion_tokens, sampling.max_tokens);
      }
      EXPECT_EQ(texts, Direct(DirectBody(prompts[i], sampling)))
          << "prompt " << i << ", temperature " << sampling.temperature;
    }
  }
}

}  // namespace
}  // namespace trainctl::trainer::internal
