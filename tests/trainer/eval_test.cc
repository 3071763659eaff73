// Eval with the real parts: JSONL made here (two files, so two datasets), shards by `trainctl
// prepare` with the real Qwen tokenizer, the tiny Qwen2-VL briefly SFT'd on the vowel task of
// grpo_test.cc, and real `trainctl-trainer` processes over Gloo.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/data/shard_reader.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/grpc_probe.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/tokenizer/qwen_fixture.h"
#include "tests/trainer/shapes_fixture.h"
#include "worker/trainer/rewards/rule_rewards.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::ReadEvents;
using testing::RunResult;
using testing::Subprocess;

constexpr int kMaxCompletion = 24;
const char* const kTableFields[] = {"prompts",     "completions", "accuracy",
                                    "format_rate", "pass@1",      "mean_completion_length"};

json ReadJson(const std::string& path) {
  return json::parse(testing::ReadFileOrEmpty(path), nullptr, /*allow_exceptions=*/false);
}

// The values of the one `metric` event among `events`.
json MetricValues(const std::vector<json>& events) {
  json values;
  int n = 0;
  for (const json& e : events) {
    if (e["type"] == "metric") {
      values = e["values"];
      ++n;
    }
  }
  EXPECT_EQ(n, 1);
  return values;
}

void ExpectTablesNear(const json& a, const json& b) {
  ASSERT_EQ(a.size(), b.size()) << a.dump() << "\n" << b.dump();
  for (const auto& [name, value] : a.items()) {
    ASSERT_TRUE(b.contains(name)) << name;
    EXPECT_NEAR(value.get<double>(), b[name].get<double>(), 1e-9) << name;
  }
}

class EvalTest : public ::testing::Test {
 protected:
  // Data and the SFT'd model, made once for the suite.
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    const std::string letters = "ABCD";
    const std::string consonants = "bdfghkmpst";
    std::mt19937 random(3);
    // The SFT answers write the format (<think>..</think><answer>L</answer>) and mostly, not
    // always, the right letter C; the eval set's solutions are all C.
    auto record = [](const std::string& problem, char answer) {
      return absl::StrCat(json{{"problem", problem},
                               {"solution", absl::StrCat("<think>a vowel</think><answer>",
                                                         std::string(1, answer), "</answer>")}}
                              .dump(),
                          "\n");
    };
    auto problem = [&] {
      std::string c;
      for (int j = 0; j < 3; ++j) c += consonants[random() % consonants.size()];
      return absl::StrCat("Which option is a vowel? A) ", c.substr(0, 1), " B) ", c.substr(1, 1),
                          " C) e D) ", c.substr(2, 1), " Answer with the letter.");
    };
    std::string sft, vowels, more;
    for (int i = 0; i < 32; ++i) {
      absl::StrAppend(&sft, record(problem(), i % 3 == 0 ? letters[random() % 4] : 'C'));
    }
    for (int i = 0; i < 8; ++i) absl::StrAppend(&vowels, record(problem(), 'C'));
    for (int i = 0; i < 7; ++i) absl::StrAppend(&more, record(problem(), 'C'));
    Prepare({dir_->Write("sft.jsonl", sft)}, Path("sft-shards"));
    Prepare({dir_->Write("vowels.jsonl", vowels), dir_->Write("more.jsonl", more)},
            Path("eval-shards"));

    const json spec = {{"kind", "sft"},
                       {"name", "format"},
                       {"model_name_or_path", "tiny"},
                       {"data_path", Path("sft-shards")},
                       {"output_dir", Path("sft")},
                       {"training",
                        {{"per_device_train_batch_size", 8},
                         {"learning_rate", 1e-2},
                         {"warmup_ratio", 0.1},
                         {"max_steps", 60},
                         {"logging_steps", 10},
                         {"save_strategy", "steps"},
                         {"save_steps", 60},
                         {"seed", 7}}}};
    RunResult r = testing::Run(TrainArgs(dir_->Write("sft.json", spec.dump()), Path("sft.jsonl")),
                               {}, absl::Minutes(10));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    model_ = new std::string(Path("sft/checkpoint-60"));
  }

  static void TearDownTestSuite() {
    delete model_;
    delete dir_;
  }

  void SetUp() override {
    ASSERT_TRUE(tokenizer::testing::QwenFixturePresent());
    ASSERT_NE(model_, nullptr);
  }

  static std::string Path(const std::string& name) { return dir_->path() + "/" + name; }

  static void Prepare(const std::vector<std::string>& inputs, const std::string& out) {
    std::vector<std::string> argv = {TRAINCTL_CLI_BIN, "prepare"};
    for (const std::string& input : inputs) {
      argv.push_back("--input");
      argv.push_back(input);
    }
    for (const std::string& a : {std::string("--out"), out, std::string("--tokenizer"),
                                 tokenizer::testing::QwenTokenizerDir()}) {
      argv.push_back(a);
    }
    RunResult prep = testing::Run(argv);
    ASSERT_EQ(prep.exit_code, 0) << prep.err;
  }

  static std::vector<std::string> TrainArgs(const std::string& spec, const std::string& events) {
    return {TRAINCTL_TRAINER_BIN, "train", "--spec", spec, "--events", events, "--threads", "1"};
  }

  // An eval spec; `training` and `extra` override the defaults.
  std::string EvalSpec(const std::string& name, const json& training,
                       const json& extra = json::object()) {
    json t = {
        {"max_completion_length", kMaxCompletion}, {"per_device_eval_batch_size", 4}, {"seed", 11}};
    t.update(training);
    json spec = {{"kind", "eval"},
                 {"name", name},
                 {"model_name_or_path", *model_},
                 {"data_path", Path("eval-shards")},
                 {"output_dir", Path(name)},
                 {"training", t}};
    spec.update(extra);
    return dir_->Write(name + ".json", spec.dump());
  }

  // Runs `world` ranks of `spec` to the end; rank 0's events.
  std::vector<json> Run(int world, const std::string& spec, const std::string& tag) {
    return testing::TrainRanks(world, TRAINCTL_TRAINER_BIN, spec, Path(tag), absl::Minutes(10));
  }

  static testing::TempDir* dir_;
  static std::string* model_;
};

testing::TempDir* EvalTest::dir_ = nullptr;
std::string* EvalTest::model_ = nullptr;

// Greedy eval writes every field, and its accuracy, format rate and lengths are what the rule
// rewards give on `trainctl-trainer generate`'s completions of the same prompts.
TEST_F(EvalTest, GreedyTableIsTheRuleRewardsOfGenerate) {
  const std::vector<json> events = Run(1, EvalSpec("greedy", json::object()), "greedy");
  const json doc = ReadJson(Path("greedy/eval.json"));
  ASSERT_TRUE(doc.is_object()) << testing::ReadFileOrEmpty(Path("greedy/eval.json"));
  EXPECT_EQ(doc["kind"], "eval");
  EXPECT_EQ(doc["model"], *model_);
  EXPECT_EQ(doc["world_size"], 1);
  EXPECT_EQ(doc["generation"]["temperature"], 0.0);
  EXPECT_EQ(doc["generation"]["num_generations"], 1);
  EXPECT_EQ(doc["datasets"], (json{"vowels", "more"}));
  for (const char* table : {"overall"}) {
    for (const char* field : kTableFields) EXPECT_TRUE(doc[table].contains(field)) << field;
  }
  EXPECT_EQ(doc["overall"]["prompts"], 15);
  EXPECT_EQ(doc["overall"]["completions"], 15);
  EXPECT_EQ(doc["by_dataset"]["vowels"]["prompts"], 8);
  EXPECT_EQ(doc["by_dataset"]["more"]["prompts"], 7);
  EXPECT_FALSE(doc.contains("baseline"));
  const json values = MetricValues(events);
  EXPECT_EQ(values["accuracy"], doc["overall"]["accuracy"]);
  EXPECT_EQ(values["vowels/accuracy"], doc["by_dataset"]["vowels"]["accuracy"]);

  // The same prompts through the generate verb, scored here.
  auto reader = data::ShardReader::Open(Path("eval-shards"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  json request = {{"input_ids", json::array()}};
  std::vector<std::string> solutions;
  for (int64_t i = 0; i < (*reader)->size(); ++i) {
    const data::SampleView v = (*reader)->View(i);
    int64_t end = 0;
    while (end < v.num_tokens && v.labels[end] == -100) ++end;
    request["input_ids"].push_back(std::vector<int64_t>(v.input_ids, v.input_ids + end));
    solutions.emplace_back(v.solution);
  }
  RunResult gen = testing::Run({TRAINCTL_TRAINER_BIN, "generate", "--model", *model_, "--request",
                                dir_->Write("request.json", request.dump()), "--max_new_tokens",
                                std::to_string(kMaxCompletion), "--out", Path("generated.json")},
                               {}, absl::Minutes(5));
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  const json generated = ReadJson(Path("generated.json"));
  auto tok = tokenizer::BpeTokenizer::Load(tokenizer::testing::QwenTokenizerDir());
  ASSERT_TRUE(tok.ok()) << tok.status();
  double correct = 0, format = 0, length = 0;
  for (size_t i = 0; i < solutions.size(); ++i) {
    const std::vector<int32_t> ids = generated["generated"][i].get<std::vector<int32_t>>();
    auto text = (*tok)->Decode(ids, /*skip_special_tokens=*/true);
    ASSERT_TRUE(text.ok()) << text.status();
    correct += rewards::AccuracyReward(*text, solutions[i]);
    format += rewards::FormatReward(*text, solutions[i]);
    length += static_cast<double>(ids.size());
  }
  const double n = static_cast<double>(solutions.size());
  std::cout << "greedy accuracy " << correct / n << ", format " << format / n << ", length "
            << length / n << "\n";
  EXPECT_DOUBLE_EQ(doc["overall"]["accuracy"].get<double>(), correct / n);
  EXPECT_DOUBLE_EQ(doc["overall"]["pass@1"].get<double>(), correct / n);
  EXPECT_DOUBLE_EQ(doc["overall"]["format_rate"].get<double>(), format / n);
  EXPECT_DOUBLE_EQ(doc["overall"]["mean_completion_length"].get<double>(), length / n);
  // The SFT taught the format and mostly C: a measurement of nothing would read 0.
  EXPECT_GT(format / n, 0.5);
  EXPECT_GT(correct / n, 0.0);
}

// Sampled eval (4 completions per prompt) on two ranks at ZeRO-3 gives one rank's table: the
// ranks split the 15 prompts 8 + 7 and each completion's seed follows from its prompt and index.
TEST_F(EvalTest, TwoRanksGiveTheTableOfOneRank) {
  const json sampled = {{"temperature", 1.0}, {"num_generations", 4}};
  const json ds3 = {{"zero_optimization", {{"stage", 3}}},
                    {"train_micro_batch_size_per_gpu", "auto"}};
  const json one_events = MetricValues(Run(1, EvalSpec("one", sampled), "one"));
  const json two_events =
      MetricValues(Run(2,
                       EvalSpec("two", sampled,
                                {{"deepspeed_config_json", ds3.dump()},
                                 {"resources", {{"nodes", 1}, {"slots_per_node", 2}}}}),
                       "two"));
  const json one = ReadJson(Path("one/eval.json")), two = ReadJson(Path("two/eval.json"));
  ASSERT_TRUE(one.is_object() && two.is_object());
  EXPECT_EQ(two["world_size"], 2);
  EXPECT_EQ(one["overall"]["completions"], 60);
  EXPECT_TRUE(one["overall"].contains("pass@4"));
  ExpectTablesNear(one["overall"], two["overall"]);
  for (const char* dataset : {"vowels", "more"}) {
    ExpectTablesNear(one["by_dataset"][dataset], two["by_dataset"][dataset]);
  }
  ExpectTablesNear(one_events, two_events);
  const double p1 = one["overall"]["pass@1"].get<double>();
  const double p4 = one["overall"]["pass@4"].get<double>();
  std::cout << "sampled pass@1 " << p1 << ", pass@4 " << p4 << "\n";
  EXPECT_DOUBLE_EQ(p1, one["overall"]["accuracy"].get<double>());
  EXPECT_GE(p4, p1);
}

// A baseline adds its own table, measured on the same prompts, beside the model's.
TEST_F(EvalTest, BaselineAddsASecondTable) {
  const std::vector<json> events =
      Run(1, EvalSpec("baseline", json::object(), {{"baseline_model_name_or_path", "tiny"}}),
          "baseline");
  const json doc = ReadJson(Path("baseline/eval.json"));
  ASSERT_TRUE(doc.contains("baseline")) << doc.dump();
  EXPECT_EQ(doc["baseline"]["model"], "tiny");
  for (const char* field : kTableFields) {
    EXPECT_TRUE(doc["baseline"]["overall"].contains(field)) << field;
    EXPECT_TRUE(doc["baseline"]["by_dataset"]["vowels"].contains(field)) << field;
  }
  EXPECT_EQ(doc["baseline"]["overall"]["prompts"], 15);
  // The model's own table is that of the greedy run without a baseline.
  const json alone = ReadJson(Path("greedy/eval.json"));
  if (alone.is_object()) ExpectTablesNear(doc["overall"], alone["overall"]);
  // The untrained tiny model writes no format; the SFT'd one does.
  EXPECT_LT(doc["baseline"]["overall"]["format_rate"].get<double>(),
            doc["overall"]["format_rate"].get<double>());
  const json values = MetricValues(events);
  EXPECT_EQ(values["baseline/accuracy"], doc["baseline"]["overall"]["accuracy"]);
  EXPECT_EQ(values["baseline/more/format_rate"],
            doc["baseline"]["by_dataset"]["more"]["format_rate"]);
}

}  // namespace
}  // namespace trainctl
