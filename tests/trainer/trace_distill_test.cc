// Trace distillation with the real parts: a tiny teacher SFT'd here by the real trainctl-trainer
// to answer in the reasoning format (<think>..</think><answer>L</answer>) with a letter drawn at
// random, so about a quarter of its completions are right; then `kind: distill` jobs over raw
// JSONL (text-only records and records with an image) with that teacher in process on one and
// two ranks, killed and resumed, and behind `trainctl-trainer serve`.
//
// The check is the issue's: the kept traces are exactly the completions the rule rewards, run
// here on the raw completions the progress files record, pass — the first keep_per_prompt of
// each prompt — and the dataset beside them holds one sample per kept trace.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/data/shard_reader.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/tokenizer/qwen_fixture.h"
#include "tests/trainer/shapes_fixture.h"
#include "worker/trainer/rewards/rule_rewards.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::RunResult;

constexpr char kSystem[] = "Think, then answer with the letter.";
constexpr int kProblems = 8;  // the teacher learns from all
constexpr int kPrompts = 7;   // distilled: odd, so two ranks get unequal shares
constexpr int kGenerations = 6;
constexpr int kKeep = 1;

// The complete lines of a JSONL file (a killed writer's torn last line left out).
std::vector<json> JsonLines(const std::string& path) {
  std::string text = testing::ReadFileOrEmpty(path);
  text.erase(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
  std::vector<json> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    out.push_back(json::parse(line));
  }
  return out;
}

// Every progress line of every rank file: index -> line; fails on a duplicate index.
std::map<int64_t, json> ProgressLines(const std::string& output_dir, int64_t* lines) {
  std::map<int64_t, json> out;
  *lines = 0;
  for (const auto& entry : fs::directory_iterator(output_dir + "/progress")) {
    if (entry.path().extension() != ".jsonl") continue;  // settings.json
    for (const json& line : JsonLines(entry.path().string())) {
      ++*lines;
      EXPECT_TRUE(out.emplace(line["index"].get<int64_t>(), line).second)
          << "prompt " << line["index"] << " done twice";
    }
  }
  return out;
}

class TraceDistillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tokenizer::testing::QwenFixturePresent());
    RunResult gen = testing::Run({TRAINCTL_CLI_BIN, "datagen", "shapes", "--out",
                                  dir_.path() + "/shapes", "--n", "2", "--seed", "1"});
    ASSERT_EQ(gen.exit_code, 0) << gen.err;
    const std::string consonants = "bdfghkmpst";
    std::mt19937 random(5);
    std::string sft, records;
    for (int i = 0; i < kProblems; ++i) {
      std::string c;
      for (int j = 0; j < 3; ++j) c += consonants[random() % consonants.size()];
      const std::string problem = absl::StrCat("Which option is a vowel? A) ", c.substr(0, 1),
                                               " B) ", c.substr(1, 1), " C) e D) ", c.substr(2, 1));
      // Every other record shows a picture (relative to the JSONL, as prepare resolves it).
      const bool image = i % 2 == 1;
      json record = {{"problem", problem},  // open-r1's format: the image goes first
                     {"solution", "<answer>C</answer>"}};
      if (image) record["image"] = "shapes/images/shape-000000.png";
      if (i < kPrompts) absl::StrAppend(&records, record.dump(), "\n");
      for (int k = 0; k < 8; ++k) {
        json messages = {
            {{"role", "system"}, {"content", kSystem}},
            {{"role", "user"}, {"content", image ? "<image>" + problem : problem}},
            {{"role", "assistant"},
             {"content", absl::StrCat("<think>e is a vowel</think><answer>",
                                      std::string(1, "ABCD"[random() % 4]), "</answer>")}}};
        json line = {{"messages", messages}};
        if (image) line["images"] = {"shapes/images/shape-000000.png"};
        absl::StrAppend(&sft, line.dump(), "\n");
      }
    }
    records_ = dir_.Write("records.jsonl", records);
    RunResult prep = testing::Run(
        {TRAINCTL_CLI_BIN, "prepare", "--input", dir_.Write("sft.jsonl", sft), "--out",
         dir_.path() + "/sft-shards", "--tokenizer", tokenizer::testing::QwenTokenizerDir()});
    ASSERT_EQ(prep.exit_code, 0) << prep.err;
    teacher_ = Teacher();
  }

  std::vector<std::string> TrainArgs(const std::string& spec, const std::string& events) {
    return {TRAINCTL_TRAINER_BIN, "train", "--spec", spec, "--events", events, "--threads", "1"};
  }

  // The tiny model SFT'd on the reasoning format with random letters, with the tokenizer beside
  // its weights as a real checkpoint has it.
  std::string Teacher() {
    const json spec = {{"kind", "sft"},
                       {"name", "teacher"},
                       {"model_name_or_path", "tiny"},
                       {"data_path", dir_.path() + "/sft-shards"},
                       {"output_dir", dir_.path() + "/teacher"},
                       {"training",
                        {{"per_device_train_batch_size", 8},
                         {"learning_rate", 1e-2},
                         {"warmup_ratio", 0.1},
                         {"max_steps", 50},
                         {"logging_steps", 10},
                         {"save_strategy", "steps"},
                         {"save_steps", 50},
                         {"seed", 7}}}};
    RunResult r = testing::Run(
        TrainArgs(dir_.Write("teacher.json", spec.dump()), dir_.path() + "/teacher.jsonl"), {},
        absl::Minutes(10));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const std::string dir = dir_.path() + "/teacher/checkpoint-50";
    for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::copy_file(tokenizer::testing::QwenTokenizerDir() + "/" + name, dir + "/" + name,
                    fs::copy_options::overwrite_existing);
    }
    return dir;
  }

  // A trace distillation spec over the records; `extra` is merged in (e.g. the teacher).
  std::string Spec(const std::string& name, const json& extra, const json& training = {}) {
    json t = {{"per_device_train_batch_size", 2}, {"num_generations", kGenerations},
              {"keep_per_prompt", kKeep},         {"max_completion_length", 24},
              {"distill_system_prompt", kSystem}, {"seed", 11}};
    if (training.is_object()) t.update(training);
    json spec = {{"kind", "distill"},
                 {"name", name},
                 {"model_name_or_path", teacher_},
                 {"data_path", records_},
                 {"output_dir", Out(name)},
                 {"training", t}};
    spec.update(extra);
    return dir_.Write(name + ".json", spec.dump());
  }

  std::string Out(const std::string& name) { return dir_.path() + "/" + name; }

  // The issue's check on a finished run; returns its traces' (index, assistant text) in order.
  // `capped_somewhere`: some prompt must have had more passing completions than were kept.
  std::vector<std::pair<int64_t, std::string>> CheckExactlyTheVerifiedTraces(
      const std::string& name, bool capped_somewhere = true) {
    const std::string out = Out(name);
    int64_t lines = 0;
    const std::map<int64_t, json> progress = ProgressLines(out, &lines);
    EXPECT_EQ(lines, kPrompts);
    EXPECT_EQ(progress.size(), static_cast<size_t>(kPrompts));
    std::vector<std::pair<int64_t, std::string>> expected;
    int64_t completions = 0, passed = 0, capped = 0;
    for (const auto& [index, line] : progress) {
      EXPECT_EQ(line["completions"].size(), static_cast<size_t>(kGenerations));
      int64_t kept_here = 0, passed_here = 0;
      for (const json& c : line["completions"]) {
        const std::string text = c["text"].get<std::string>();
        const bool pass = rewards::AccuracyReward(text, "<answer>C</answer>") == 1.0f &&
                          rewards::FormatReward(text, "") == 1.0f;
        EXPECT_EQ(c["passed"].get<bool>(), pass) << text;
        ++completions;
        passed += pass;
        passed_here += pass;
        if (pass && kept_here < kKeep) {
          expected.emplace_back(index, text);
          ++kept_here;
        }
      }
      capped += passed_here > kKeep;
    }
    // A teacher that guesses: some completions pass, some do not, and some prompt has more
    // passing completions than are kept (measured in process: 8 of 42 pass, 7 kept, on one
    // rank and on two; through serve: 5 of 42).
    EXPECT_GT(passed, 0);
    EXPECT_LT(passed, completions);
    if (capped_somewhere) {
      EXPECT_GT(capped, 0);
    }

    std::vector<std::pair<int64_t, std::string>> traces;
    for (const json& t : JsonLines(out + "/traces.jsonl")) {
      const json& messages = t["messages"];
      EXPECT_EQ(messages.size(), 3u);
      EXPECT_EQ(messages[0]["role"], "system");
      EXPECT_EQ(messages[0]["content"][0]["text"], kSystem);
      EXPECT_EQ(messages[1]["role"], "user");
      EXPECT_EQ(messages[2]["role"], "assistant");
      EXPECT_EQ(t["solution"], "<answer>C</answer>");
      const int64_t index = t["index"].get<int64_t>();
      if (index % 2 == 1) {
        EXPECT_EQ(messages[1]["content"][0]["type"], "image");
        EXPECT_EQ(t["images"].size(), 1u);
        EXPECT_TRUE(fs::path(t["images"][0].get<std::string>()).is_absolute());
        EXPECT_TRUE(fs::exists(t["images"][0].get<std::string>()));
      } else {
        EXPECT_TRUE(t["images"].empty());
      }
      traces.emplace_back(index, messages[2]["content"][0]["text"].get<std::string>());
    }
    EXPECT_EQ(traces, expected);

    auto reader = data::ShardReader::Open(out + "/dataset");
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (reader.ok()) {
      EXPECT_EQ((*reader)->size(), static_cast<int64_t>(expected.size()));
    }
    const json manifest = json::parse(testing::ReadFileOrEmpty(out + "/distill_manifest.json"));
    EXPECT_EQ(manifest["prompts"], kPrompts);
    EXPECT_EQ(manifest["completions"], completions);
    EXPECT_EQ(manifest["passed"], passed);
    EXPECT_EQ(manifest["kept"], static_cast<int64_t>(expected.size()));
    EXPECT_DOUBLE_EQ(manifest["pass_rate"].get<double>(),
                     static_cast<double>(passed) / static_cast<double>(completions));
    EXPECT_EQ(manifest["sampling"]["num_generations"], kGenerations);
    EXPECT_EQ(manifest["system_prompt"], kSystem);
    std::cout << name << ": pass rate " << manifest["pass_rate"] << ", kept " << manifest["kept"]
              << ", " << manifest["seconds"] << " s, " << manifest["tokens_per_second"]
              << " tokens/s\n";
    return traces;
  }

  testing::TempDir dir_;
  std::string records_;
  std::string teacher_;
};

TEST_F(TraceDistillTest, InProcessTeacherKeepsExactlyTheVerifiedTracesOnOneAndTwoRanks) {
  const json teacher = {{"teacher_model_name_or_path", teacher_}};
  RunResult r =
      testing::Run(TrainArgs(Spec("one", teacher), Out("one.jsonl")), {}, absl::Minutes(5));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto one = CheckExactlyTheVerifiedTraces("one");

  // The events count the prompts and report the pass rate.
  bool progress_event = false;
  for (const json& e : testing::ReadEvents(Out("one.jsonl"))) {
    if (e["type"] != "metric") continue;
    EXPECT_EQ(e["values"]["prompts_total"], kPrompts);
    EXPECT_TRUE(e["values"].contains("pass_rate"));
    EXPECT_GT(e["values"]["tokens_per_second"].get<double>(), 0);
    progress_event = e["values"]["prompts_done"] == kPrompts;
  }
  EXPECT_TRUE(progress_event);

  // Two ranks share the prompts; each completion is seeded by its prompt, so the traces agree.
  // Under ZeRO-3 the ranks decode in lock-step, one prompt a batch: the rank with three prompts
  // decodes a placeholder while the other does its fourth.
  json zero3 = teacher;
  zero3["deepspeed_config_json"] = json{
      {"zero_optimization", {{"stage", 3}}},
      {"train_micro_batch_size_per_gpu",
       "auto"}}.dump();
  testing::TrainRanks(2, TRAINCTL_TRAINER_BIN,
                      Spec("two", zero3, {{"per_device_train_batch_size", 1}}), Out("two"),
                      absl::Minutes(5));
  EXPECT_TRUE(fs::exists(Out("two") + "/progress/rank-1.jsonl"));
  EXPECT_EQ(CheckExactlyTheVerifiedTraces("two"), one);
}

TEST_F(TraceDistillTest, KillMidRunResumesWithoutRedoingPrompts) {
  const json teacher = {{"teacher_model_name_or_path", teacher_}};
  const json one_at_a_time = {{"per_device_train_batch_size", 1}};
  RunResult r = testing::Run(TrainArgs(Spec("whole", teacher, one_at_a_time), Out("whole.jsonl")),
                             {}, absl::Minutes(5));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto whole = CheckExactlyTheVerifiedTraces("whole");

  // Two ranks, killed with SIGKILL once a prompt is done, then finished by one rank.
  const std::string spec = Spec("killed", teacher, one_at_a_time);
  {
    auto ranks = testing::LaunchRanks(2, TRAINCTL_TRAINER_BIN, spec, Out("killed-run"));
    ASSERT_TRUE(testing::WaitFor(
        [&] {
          return testing::ReadFileOrEmpty(Out("killed") + "/progress/rank-0.jsonl").find('\n') !=
                 std::string::npos;
        },
        absl::Minutes(3)));
    for (auto& rank : ranks) rank->Kill(SIGKILL);
    for (auto& rank : ranks) EXPECT_TRUE(rank->Wait(absl::Seconds(30)).ok());
  }
  int64_t lines = 0;
  const size_t done_before = ProgressLines(Out("killed"), &lines).size();
  EXPECT_GE(done_before, 1u);
  EXPECT_LT(done_before, static_cast<size_t>(kPrompts)) << "the kill came after the last prompt";
  EXPECT_FALSE(fs::exists(Out("killed") + "/traces.jsonl"));

  r = testing::Run(TrainArgs(spec, Out("killed.jsonl")), {}, absl::Minutes(5));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CheckExactlyTheVerifiedTraces("killed"), whole);
}

TEST_F(TraceDistillTest, EndpointTeacherServedByServeKeepsExactlyTheVerifiedTraces) {
  dir_.Write("teacher/checkpoint-50/generation_config.json",
             R"({"eos_token_id": [151645, 151643], "pad_token_id": 151643})");
  const std::string log = Out("serve.log");
  testing::Subprocess serve({TRAINCTL_TRAINER_BIN, "serve", "--model", teacher_, "--listen",
                             "127.0.0.1:0", "--max_batch", "8"},
                            log);
  int port = 0;
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        const std::string text = testing::ReadFileOrEmpty(log);
        const size_t at = text.find("http://127.0.0.1:");
        if (at == std::string::npos || text.find('\n', at) == std::string::npos) return false;
        port = std::stoi(text.substr(at + 17));
        return true;
      },
      absl::Seconds(60)))
      << testing::ReadFileOrEmpty(log);
  const json endpoint = {{"teacher_endpoint", absl::StrCat("http://127.0.0.1:", port, "/v1")}};
  RunResult r = testing::Run(
      TrainArgs(Spec("served", endpoint, {{"teacher_concurrency", 4}}), Out("served.jsonl")), {},
      absl::Minutes(5));
  serve.Kill(SIGTERM);
  EXPECT_TRUE(serve.Wait(absl::Seconds(30)).ok());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The server samples with its own generators: another draw, checked the same way.
  CheckExactlyTheVerifiedTraces("served", /*capped_somewhere=*/false);
  const json manifest =
      json::parse(testing::ReadFileOrEmpty(Out("served") + "/distill_manifest.json"));
  EXPECT_EQ(manifest["teacher"]["kind"], "endpoint");
}

// Errors found before any teacher is asked: an endpoint teacher whose model is named needs no
// server until the first prompt, and the Qwen tokenizer directory stands in for the student.
class TraceDistillErrorsTest : public ::testing::Test {
 protected:
  RunResult Distill(const std::string& records, const json& training = json::object()) {
    json spec = {{"kind", "distill"},
                 {"name", "errors"},
                 {"model_name_or_path", tokenizer::testing::QwenTokenizerDir()},
                 {"teacher_endpoint", "http://127.0.0.1:1/v1"},
                 {"teacher_endpoint_model", "m"},
                 {"data_path", dir_.Write("records.jsonl", records)},
                 {"output_dir", dir_.path() + "/out"},
                 {"training", training}};
    return testing::Run(
        {TRAINCTL_TRAINER_BIN, "train", "--spec", dir_.Write("errors.json", spec.dump()),
         "--events", dir_.path() + "/errors.jsonl", "--threads", "1"},
        {}, absl::Minutes(2));
  }

  testing::TempDir dir_;
};

TEST_F(TraceDistillErrorsTest, ABadRecordIsNamedByFileAndLine) {
  ASSERT_TRUE(tokenizer::testing::QwenFixturePresent());
  RunResult r =
      Distill("{\"problem\": \"1+1?\", \"solution\": \"2\"}\n\n{\"problem\": \"no solution\"}\n");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(dir_.path() + "/records.jsonl:3: "), std::string::npos) << r.err;
  r = Distill("{\"problem\": \"look\", \"image\": \"missing.png\", \"solution\": \"2\"}\n");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("records.jsonl:1: image 'missing.png' not found"), std::string::npos)
      << r.err;
}

TEST_F(TraceDistillErrorsTest, ProgressOfOtherSettingsIsNotContinued) {
  ASSERT_TRUE(tokenizer::testing::QwenFixturePresent());
  fs::create_directories(dir_.path() + "/out/progress");
  dir_.Write("out/progress/settings.json", R"({"seed": 1})");
  RunResult r = Distill("{\"problem\": \"1+1?\", \"solution\": \"2\"}\n");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("settings.json records another run"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("seed"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace trainctl
