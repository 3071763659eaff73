// The OpenAI-endpoint teacher of trace distillation against a fake OpenAI server on loopback
// (cpp-httplib's server): the answers and the request bodies, retries and back-off on 500 and
// 429 (Retry-After), 400s failing at once, retries running out, timeouts, the concurrency bound,
// model discovery, servers that cap n, bad options and images.
#include "worker/trainer/stages/internal/endpoint_teacher.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace trainctl::trainer::internal {
namespace {

using nlohmann::json;
using tokenizer::ChatMessage;
using tokenizer::ChatPart;

// What the fake server saw of one request.
struct SeenRequest {
  json body;
  std::string authorization;
  absl::Time at;
};

// A fake OpenAI server. Each chat completion goes to `on_chat` (the default answers every choice
// with "<last text part>/<k>"), called with the request's number (1, 2, ...) among all of them.
class FakeOpenAi {
 public:
  using ChatHandler = std::function<void(const json& body, int call, httplib::Response& res)>;

  explicit FakeOpenAi(ChatHandler on_chat = Answer) : on_chat_(std::move(on_chat)) {
    server_.new_task_queue = [] { return new httplib::ThreadPool(16); };
    server_.set_tcp_nodelay(true);
    server_.Post(
        "/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
          int call = 0;
          {
            absl::MutexLock lock(&mu_);
            seen_.push_back(
                {json::parse(req.body), req.get_header_value("Authorization"), absl::Now()});
            call = static_cast<int>(seen_.size());
            max_in_flight_ = std::max(max_in_flight_, ++in_flight_);
          }
          on_chat_(json::parse(req.body), call, res);
          absl::MutexLock lock(&mu_);
          --in_flight_;
        });
    server_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      absl::MutexLock lock(&mu_);
      ++model_lists_;
      res.set_content(models_.dump(), "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    EXPECT_TRUE(testing::WaitFor([this] { return server_.is_running(); }, absl::Seconds(10)));
  }
  ~FakeOpenAi() {
    Release();
    server_.stop();
    thread_.join();
  }

  std::string BaseUrl() const { return absl::StrCat("http://127.0.0.1:", port_, "/v1"); }
  std::vector<SeenRequest> seen() const {
    absl::MutexLock lock(&mu_);
    return seen_;
  }
  int max_in_flight() const {
    absl::MutexLock lock(&mu_);
    return max_in_flight_;
  }
  int model_lists() const {
    absl::MutexLock lock(&mu_);
    return model_lists_;
  }
  void set_models(json models) {
    absl::MutexLock lock(&mu_);
    models_ = std::move(models);
  }
  // Blocks a handler until Release (or `cap`): a server that never answers.
  void Hold(absl::Duration cap) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&released_), cap);
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  // Blocks a handler until `count` requests were in flight at once (or `cap`).
  void AwaitInFlight(int count, absl::Duration cap) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, count] {
      mu_.AssertHeld();
      return max_in_flight_ >= count;
    };
    mu_.AwaitWithTimeout(absl::Condition(&reached), cap);
  }

  // The last text part of the last message.
  static std::string LastText(const json& body) {
    const json& content = body["messages"].back()["content"];
    std::string text;
    for (const json& part : content) {
      if (part["type"] == "text") text = part["text"].get<std::string>();
    }
    return text;
  }
  // `choices` choices "<text>/<k>", finish reasons stop/length alternating, 3 tokens each in
  // usage only.
  static json ChatAnswer(const json& body, int64_t choices) {
    json out = {{"id", "chatcmpl-1"}, {"object", "chat.completion"}, {"choices", json::array()}};
    for (int64_t k = 0; k < choices; ++k) {
      out["choices"].push_back(
          {{"index", k},
           {"message", {{"role", "assistant"}, {"content", absl::StrCat(LastText(body), "/", k)}}},
           {"finish_reason", k % 2 == 0 ? "stop" : "length"}});
    }
    out["usage"] = {{"prompt_tokens", 11}, {"completion_tokens", 3 * choices}};
    return out;
  }
  static void Answer(const json& body, int, httplib::Response& res) {
    res.set_content(ChatAnswer(body, body.value("n", int64_t{1})).dump(), "application/json");
  }
  static void Error(httplib::Response& res, int status, const std::string& message) {
    res.status = status;
    res.set_content(json{{"error", {{"message", message}, {"type", "server_error"}}}}.dump(),
                    "application/json");
  }

 private:
  ChatHandler on_chat_;
  mutable absl::Mutex mu_;
  std::vector<SeenRequest> seen_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int max_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int model_lists_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  json models_ ABSL_GUARDED_BY(mu_) = {{"object", "list"},
                                       {"data", {{{"id", "teacher-7b"}}, {{"id", "other"}}}}};
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

TeacherPrompt TextPrompt(int64_t index, const std::string& text) {
  TeacherPrompt p;
  p.index = index;
  p.messages = {{"system", {ChatPart::Text("Think step by step.")}},
                {"user", {ChatPart::Text(text)}}};
  return p;
}

EndpointTeacherOptions FastOptions(const FakeOpenAi& server) {
  EndpointTeacherOptions o;
  o.base_url = server.BaseUrl();
  o.model = "teacher";
  o.timeout_seconds = 10;
  o.backoff_initial_seconds = 0.01;
  o.backoff_max_seconds = 0.05;
  return o;
}

std::unique_ptr<Teacher> MakeOrDie(const EndpointTeacherOptions& options) {
  auto teacher = MakeEndpointTeacher(options);
  EXPECT_TRUE(teacher.ok()) << teacher.status();
  return teacher.ok() ? *std::move(teacher) : nullptr;
}

class EndpointTeacherTest : public ::testing::Test {
 protected:
  // A PNG file's bytes (the signature then anything: the teacher does not decode images).
  std::string png_ = std::string("\x89PNG\r\n\x1a\n", 8) + std::string("\x00\x01\xfe\xff rest", 9);
  std::string jpeg_ = std::string("\xff\xd8\xff\xe0", 4) + "jfif";
  testing::TempDir dir_;
};

// Answers in prompt order with their texts, finish reasons and tokens; the bodies the server saw.
TEST_F(EndpointTeacherTest, AnswersInPromptOrderAndRequestBodiesAreRight) {
  FakeOpenAi server;
  EndpointTeacherOptions options = FastOptions(server);
  options.api_key = "sk-test";
  options.concurrency = 3;
  auto teacher = MakeOrDie(options);
  ASSERT_NE(teacher, nullptr);
  std::vector<TeacherPrompt> prompts;
  for (int64_t i = 0; i < 7; ++i) prompts.push_back(TextPrompt(10 + i, absl::StrCat("q", i)));
  // Prompt 12 has two images: a PNG between texts, a JPEG last.
  prompts[2].messages[1].content = {ChatPart::Text("look:"), ChatPart::Image(0),
                                    ChatPart::Text("and"), ChatPart::Image(0),
                                    ChatPart::Text("q2")};
  prompts[2].images = {dir_.Write("a.png", png_), dir_.Write("b.jpg", jpeg_)};
  TeacherSampling sampling;
  sampling.n = 2;
  sampling.temperature = 0.7;
  sampling.top_p = 0.9;
  sampling.max_tokens = 17;
  sampling.seed = 100;
  auto answers = teacher->Complete(prompts, sampling);
  ASSERT_TRUE(answers.ok()) << answers.status();
  ASSERT_EQ(answers->size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const TeacherAnswer& a = (*answers)[i];
    EXPECT_EQ(a.index, prompts[i].index);
    EXPECT_EQ(a.prompt_tokens, 11);
    ASSERT_EQ(a.completions.size(), 2u);
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(a.completions[k].text, absl::StrCat("q", i, "/", k));
      EXPECT_EQ(a.completions[k].finish_reason, k == 0 ? "stop" : "length");
      EXPECT_EQ(a.completions[k].completion_tokens, 3);  // usage's 6 split over 2 choices
    }
  }
  const std::vector<SeenRequest> seen = server.seen();
  ASSERT_EQ(seen.size(), prompts.size());
  for (const SeenRequest& r : seen) {
    const json& b = r.body;
    const int i = std::stoi(FakeOpenAi::LastText(b).substr(1));
    EXPECT_EQ(r.authorization, "Bearer sk-test");
    EXPECT_EQ(b["model"], "teacher");
    EXPECT_EQ(b["n"], 2);
    EXPECT_EQ(b["seed"].get<uint64_t>(), EndpointRequestSeed(100, 10 + i, 0));
    EXPECT_EQ(b["max_tokens"], 17);
    EXPECT_DOUBLE_EQ(b["temperature"].get<double>(), 0.7);
    EXPECT_DOUBLE_EQ(b["top_p"].get<double>(), 0.9);
    EXPECT_FALSE(b.contains("top_k"));
    ASSERT_EQ(b["messages"].size(), 2u);
    EXPECT_EQ(b["messages"][0], json::parse(R"({"role": "system", "content": [{"type": "text",
                              "text": "Think step by step."}]})"));
    EXPECT_EQ(b["messages"][1]["role"], "user");
    if (i != 2) continue;
    const json& content = b["messages"][1]["content"];
    ASSERT_EQ(content.size(), 5u) << content.dump();
    EXPECT_EQ(content[0], json::parse(R"({"type": "text", "text": "look:"})"));
    const std::vector<std::pair<std::string, std::string>> images = {{"image/png", png_},
                                                                     {"image/jpeg", jpeg_}};
    for (size_t k = 0; k < images.size(); ++k) {
      const json& part = content[1 + 2 * k];
      EXPECT_EQ(part["type"], "image_url");
      const std::string url = part["image_url"]["url"];
      const std::string head = absl::StrCat("data:", images[k].first, ";base64,");
      ASSERT_TRUE(absl::StartsWith(url, head)) << url;
      std::string bytes;
      ASSERT_TRUE(absl::Base64Unescape(url.substr(head.size()), &bytes));
      EXPECT_EQ(bytes, images[k].second);
    }
  }
  // top_k goes only when set; no api_key, no Authorization.
  options.api_key.clear();
  teacher = MakeOrDie(options);
  sampling.top_k = 5;
  ASSERT_TRUE(teacher->Complete({TextPrompt(0, "q0")}, sampling).ok());
  EXPECT_EQ(server.seen().back().body["top_k"], 5);
  EXPECT_EQ(server.seen().back().authorization, "");
  EXPECT_EQ(json::parse(teacher->DescribeJson()),
            json({{"kind", "endpoint"}, {"model", "teacher"}, {"url", server.BaseUrl()}}));
}

TEST_F(EndpointTeacherTest, RetriesServerErrorsWithBackOff) {
  FakeOpenAi server([](const json& body, int call, httplib::Response& res) {
    if (call <= 2) return FakeOpenAi::Error(res, 500, "boom");
    FakeOpenAi::Answer(body, call, res);
  });
  EndpointTeacherOptions options = FastOptions(server);
  options.backoff_initial_seconds = 0.1;
  options.backoff_max_seconds = 1;
  auto teacher = MakeOrDie(options);
  ASSERT_NE(teacher, nullptr);
  auto answers = teacher->Complete({TextPrompt(3, "hello")}, {});
  ASSERT_TRUE(answers.ok()) << answers.status();
  EXPECT_EQ((*answers)[0].completions[0].text, "hello/0");
  const auto seen = server.seen();
  ASSERT_EQ(seen.size(), 3u);
  // Waits of initial × 2^k, jittered down to half at most: ≥ 0.05 s, then ≥ 0.1 s.
  EXPECT_GE(seen[1].at - seen[0].at, absl::Milliseconds(50));
  EXPECT_GE(seen[2].at - seen[1].at, absl::Milliseconds(100));
  EXPECT_EQ(seen[0].body, seen[2].body);  // the same request again
}

TEST_F(EndpointTeacherTest, HonoursRetryAfter) {
  FakeOpenAi server([](const json& body, int call, httplib::Response& res) {
    if (call == 1) {
      res.set_header("Retry-After", "1");
      return FakeOpenAi::Error(res, 429, "slow down");
    }
    FakeOpenAi::Answer(body, call, res);
  });
  EndpointTeacherOptions options = FastOptions(server);
  options.backoff_max_seconds = 5;  // Retry-After is capped by it
  auto teacher = MakeOrDie(options);
  ASSERT_NE(teacher, nullptr);
  ASSERT_TRUE(teacher->Complete({TextPrompt(0, "x")}, {}).ok());
  const auto seen = server.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_GE(seen[1].at - seen[0].at, absl::Seconds(1));
}

TEST_F(EndpointTeacherTest, ClientErrorFailsAtOnceNamingPromptAndMessage) {
  FakeOpenAi server([](const json&, int, httplib::Response& res) {
    FakeOpenAi::Error(res, 400, "messages[1].content[0]: unsupported part");
  });
  auto teacher = MakeOrDie(FastOptions(server));
  ASSERT_NE(teacher, nullptr);
  auto answers = teacher->Complete({TextPrompt(7, "x")}, {});
  ASSERT_FALSE(answers.ok());
  EXPECT_EQ(answers.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(answers.status().message());
  EXPECT_TRUE(absl::StrContains(message, "prompt 7")) << message;
  EXPECT_TRUE(absl::StrContains(message, "HTTP 400")) << message;
  EXPECT_TRUE(absl::StrContains(message, "unsupported part")) << message;
  EXPECT_TRUE(absl::StrContains(message, server.BaseUrl() + "/chat/completions")) << message;
  EXPECT_EQ(server.seen().size(), 1u);
}

TEST_F(EndpointTeacherTest, RetriesRunOutNamingStatusAndAttempts) {
  FakeOpenAi server(
      [](const json&, int, httplib::Response& res) { FakeOpenAi::Error(res, 503, "overloaded"); });
  EndpointTeacherOptions options = FastOptions(server);
  options.max_retries = 2;
  auto teacher = MakeOrDie(options);
  ASSERT_NE(teacher, nullptr);
  auto answers = teacher->Complete({TextPrompt(9, "a")}, {});
  ASSERT_FALSE(answers.ok());
  EXPECT_EQ(answers.status().code(), absl::StatusCode::kUnavailable);
  const std::string message(answers.status().message());
  EXPECT_TRUE(absl::StrContains(message, "prompt 9")) << message;
  EXPECT_TRUE(absl::StrContains(message, "HTTP 503: overloaded after 3 attempts")) << message;
  EXPECT_EQ(server.seen().size(), 3u);
}

TEST_F(EndpointTeacherTest, ServerThatNeverAnswersTimesOut) {
  FakeOpenAi* self = nullptr;
  FakeOpenAi server([&self](const json&, int, httplib::Response& res) {
    self->Hold(absl::Seconds(30));
    FakeOpenAi::Error(res, 500, "late");
  });
  self = &server;
  EndpointTeacherOptions options = FastOptions(server);
  options.timeout_seconds = 0.3;
  options.max_retries = 1;
  auto teacher = MakeOrDie(options);
  ASSERT_NE(teacher, nullptr);
  const absl::Time start = absl::Now();
  auto answers = teacher->Complete({TextPrompt(4, "x")}, {});
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(answers.ok());
  EXPECT_EQ(answers.status().code(), absl::StatusCode::kDeadlineExceeded) << answers.status();
  EXPECT_TRUE(absl::StrContains(answers.status().message(), "timeout")) << answers.status();
  EXPECT_TRUE(absl::StrContains(answers.status().message(), "prompt 4")) << answers.status();
  EXPECT_GE(took, absl::Milliseconds(600));  // two attempts of 0.3 s
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_EQ(server.seen().size(), 2u);
}

TEST_F(EndpointTeacherTest, KeepsToTheConcurrencyBound) {
  FakeOpenAi* self = nullptr;
  FakeOpenAi server([&self](const json& body, int call, httplib::Response& res) {
    self->AwaitInFlight(3, absl::Seconds(10));  // until three were in flight together once
    FakeOpenAi::Answer(body, call, res);
  });
  self = &server;
  EndpointTeacherOptions options = FastOptions(server);
  options.concurrency = 3;
  auto teacher = MakeOrDie(options);
  ASSERT_NE(teacher, nullptr);
  std::vector<TeacherPrompt> prompts;
  for (int64_t i = 0; i < 10; ++i) prompts.push_back(TextPrompt(i, absl::StrCat("p", i)));
  const absl::Time start = absl::Now();
  auto answers = teacher->Complete(prompts, {});
  ASSERT_TRUE(answers.ok()) << answers.status();
  for (int64_t i = 0; i < 10; ++i) {
    EXPECT_EQ((*answers)[static_cast<size_t>(i)].completions[0].text, absl::StrCat("p", i, "/0"));
  }
  EXPECT_EQ(server.seen().size(), 10u);
  EXPECT_EQ(server.max_in_flight(), 3);
  EXPECT_LT(absl::Now() - start, absl::Seconds(9));  // three did meet
}

TEST_F(EndpointTeacherTest, DiscoversTheModel) {
  FakeOpenAi server;
  EndpointTeacherOptions options = FastOptions(server);
  options.model.clear();
  options.base_url += "/";  // a trailing slash is fine
  auto teacher = MakeOrDie(options);
  ASSERT_NE(teacher, nullptr);
  EXPECT_EQ(server.model_lists(), 1);
  ASSERT_TRUE(teacher->Complete({TextPrompt(0, "x")}, {}).ok());
  ASSERT_TRUE(teacher->Complete({TextPrompt(1, "y")}, {}).ok());
  EXPECT_EQ(server.model_lists(), 1);  // once
  EXPECT_EQ(server.seen().back().body["model"], "teacher-7b");
  EXPECT_EQ(json::parse(teacher->DescribeJson())["model"], "teacher-7b");

  server.set_models({{"object", "list"}, {"data", json::array()}});
  auto none = MakeEndpointTeacher(options);
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(absl::StrContains(none.status().message(), server.BaseUrl() + "/models"))
      << none.status();
  EXPECT_TRUE(absl::StrContains(none.status().message(), "no model")) << none.status();

  // Nobody listening: a connection error naming the URL once the retries are spent.
  const int port = testing::FreeLoopbackPort();
  ASSERT_GT(port, 0);
  options.base_url = absl::StrCat("http://127.0.0.1:", port, "/v1");
  options.max_retries = 1;
  auto unreachable = MakeEndpointTeacher(options);
  ASSERT_FALSE(unreachable.ok());
  EXPECT_EQ(unreachable.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(unreachable.status().message(), options.base_url + "/models"))
      << unreachable.status();
  EXPECT_TRUE(absl::StrContains(unreachable.status().message(), "connection failed"))
      << unreachable.status();
}

// A server that gives at most 2 choices a request: the rest is asked for again, with other seeds;
// token counts come from each choice's token_ids when the server sends them.
TEST_F(EndpointTeacherTest, AsksAgainWhenTheServerCapsN) {
  FakeOpenAi server([](const json& body, int, httplib::Response& res) {
    json out = FakeOpenAi::ChatAnswer(body, std::min<int64_t>(body["n"].get<int64_t>(), 2));
    for (size_t k = 0; k < out["choices"].size(); ++k) {
      out["choices"][k]["message"]["content"] =
          absl::StrCat("seed ", body["seed"].get<int64_t>(), " #", k);
      out["choices"][k]["token_ids"] = std::vector<int>(k + 4, 7);
    }
    res.set_content(out.dump(), "application/json");
  });
  auto teacher = MakeOrDie(FastOptions(server));
  ASSERT_NE(teacher, nullptr);
  TeacherSampling sampling;
  sampling.n = 5;
  sampling.seed = 1;
  auto answers = teacher->Complete({TextPrompt(2, "x")}, sampling);
  ASSERT_TRUE(answers.ok()) << answers.status();
  const auto& completions = (*answers)[0].completions;
  ASSERT_EQ(completions.size(), 5u);
  const auto seen = server.seen();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].body["n"], 5);
  EXPECT_EQ(seen[1].body["n"], 3);
  EXPECT_EQ(seen[2].body["n"], 1);
  EXPECT_EQ(seen[0].body["seed"].get<uint64_t>(), EndpointRequestSeed(1, 2, 0));
  EXPECT_EQ(seen[1].body["seed"].get<uint64_t>(), EndpointRequestSeed(1, 2, 1));
  EXPECT_NE(seen[1].body["seed"], seen[0].body["seed"]);
  EXPECT_NE(seen[2].body["seed"], seen[1].body["seed"]);
  const std::vector<int64_t> tokens = {4, 5, 4, 5, 4};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(completions[i].text,
              absl::StrCat("seed ", seen[i / 2].body["seed"].get<int64_t>(), " #", i % 2));
    EXPECT_EQ(completions[i].completion_tokens, tokens[i]);
  }
}

TEST_F(EndpointTeacherTest, RefusesBadOptionsImagesAndAnswers) {
  EndpointTeacherOptions options;
  options.model = "m";
  for (const char* url : {"", "ftp://host/v1", "http:///v1", "http://host/v1?x=1"}) {
    options.base_url = url;
    auto t = MakeEndpointTeacher(options);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << url;
  }
  options.base_url = "http://127.0.0.1:1/v1";
  options.concurrency = 0;
  EXPECT_EQ(MakeEndpointTeacher(options).status().code(), absl::StatusCode::kInvalidArgument);

  FakeOpenAi server([](const json&, int, httplib::Response& res) {
    res.set_content(R"({"choices": "nope"})", "application/json");
  });
  auto teacher = MakeOrDie(FastOptions(server));
  ASSERT_NE(teacher, nullptr);
  TeacherPrompt text_file = TextPrompt(5, "x");
  text_file.messages[1].content.push_back(ChatPart::Image(0));
  text_file.images = {dir_.Write("notes.txt", "not an image")};
  auto refused = teacher->Complete({text_file}, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "prompt 5")) << refused.status();
  EXPECT_TRUE(server.seen().empty());
  auto malformed = teacher->Complete({TextPrompt(6, "x")}, {});
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(malformed.status().message(), "prompt 6")) << malformed.status();
}

}  // namespace
}  // namespace trainctl::trainer::internal
