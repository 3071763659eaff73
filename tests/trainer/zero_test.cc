// The ZeRO engine across real trainer processes: N `trainctl-trainer` ranks rendezvous on loopback
// through the TCPStore and train the tiny model over Gloo, one thread each.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/shapes_fixture.h"

namespace trainctl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::Losses;
using testing::ReadEvents;
using testing::Subprocess;

std::string DeepSpeed(int stage, const json& extra = json::object()) {
  json ds = {{"zero_optimization",
              {{"stage", stage}, {"overlap_comm", true}, {"reduce_bucket_size", "auto"}}},
             {"gradient_clipping", 1.0},
             {"train_micro_batch_size_per_gpu", "auto"},
             {"gradient_accumulation_steps", "auto"}};
  ds.merge_patch(extra);
  return ds.dump();
}

class ZeroTest : public testing::ShapesTrainingTest {
 protected:
  // The ranks of one run, each a real trainer process with the launch environment.
  struct Ranks {
    std::vector<std::unique_ptr<Subprocess>> procs;
    std::vector<std::string> events;  // per rank
    std::vector<std::string> logs;
  };

  Ranks Launch(int world, const std::string& spec, const std::string& tag) {
    return Launch(std::vector<std::string>(world, spec), tag);
  }

  // One spec per rank.
  Ranks Launch(const std::vector<std::string>& specs, const std::string& tag) {
    const int world = static_cast<int>(specs.size());
    Ranks ranks;
    const int port = testing::FreeLoopbackPort();
    for (int r = 0; r < world; ++r) {
      ranks.events.push_back(absl::StrCat(dir_.path(), "/", tag, ".", r, ".jsonl"));
      ranks.logs.push_back(absl::StrCat(dir_.path(), "/", tag, ".", r, ".log"));
      std::vector<std::string> argv = {"/usr/bin/env",
                                       absl::StrCat("RANK=", r),
                                       absl::StrCat("LOCAL_RANK=", r),
                                       absl::StrCat("WORLD_SIZE=", world),
                                       "MASTER_ADDR=127.0.0.1",
                                       absl::StrCat("MASTER_PORT=", port)};
      for (const std::string& a : TrainArgs(specs[r], ranks.events.back())) argv.push_back(a);
      ranks.procs.push_back(std::make_unique<Subprocess>(argv, ranks.logs.back()));
    }
    return ranks;
  }

  // Waits for every rank; their exit codes (-1 for a signal, -2 for still running at the end).
  std::vector<int> Wait(Ranks& ranks, absl::Duration timeout) {
    std::vector<int> codes;
    const absl::Time deadline = absl::Now() + timeout;
    for (auto& p : ranks.procs) {
      auto code = p->Wait(std::max(absl::ZeroDuration(), deadline - absl::Now()));
      codes.push_back(code.ok() ? *code : -2);
    }
    return codes;
  }

  // Runs to completion and returns rank 0's losses; every rank must exit 0.
  std::map<int64_t, double> Train(int world, const std::string& spec, const std::string& tag) {
    Ranks ranks = Launch(world, spec, tag);
    const std::vector<int> codes = Wait(ranks, absl::Minutes(10));
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(codes[r], 0) << tag << " rank " << r << ":\n"
                             << testing::ReadFileOrEmpty(ranks.logs[r]);
    }
    last_events_ = ranks.events;
    return Losses(ReadEvents(ranks.events[0]));
  }

  std::string ZeroSpec(const std::string& name, int stage, int batch, int accumulation, int steps,
                       const json& training = json::object(),
                       const json& ds_extra = json::object()) {
    json t = {{"per_device_train_batch_size", batch},
              {"gradient_accumulation_steps", accumulation},
              {"max_steps", steps},
              {"save_strategy", "no"},
              {"ddp_timeout", 60}};
    t.update(training);
    return WriteSpec(name, dir_.path() + "/" + name, t,
                     {{"deepspeed_config_json", DeepSpeed(stage, ds_extra)}});
  }

  static void ExpectClose(const std::map<int64_t, double>& reference,
                          const std::map<int64_t, double>& got, const std::string& what,
                          double tolerance = 1e-5) {
    testing::ExpectLossesClose(reference, got, what, tolerance);
  }

  // Two stage-3 ranks with ddp_timeout `timeout_s`; once rank 0 has done two steps, rank 1 gets
  // `signal`. Rank 0 must exit non-zero within the timeout and a few seconds, naming the
  // collective and rank 1.
  void ExpectPeerFailureNamed(int signal, int timeout_s, const std::string& name) {
    Ranks ranks = Launch(2, ZeroSpec(name, 3, 2, 1, 10000, {{"ddp_timeout", timeout_s}}), name);
    ASSERT_TRUE(testing::WaitFor([&] { return Losses(ReadEvents(ranks.events[0])).size() >= 2; },
                                 absl::Minutes(3)));
    ranks.procs[1]->Kill(signal);
    const absl::Time hit = absl::Now();
    auto code = ranks.procs[0]->Wait(absl::Seconds(30));
    ranks.procs[1]->Kill(SIGKILL);
    ASSERT_TRUE(code.ok()) << "rank 0 still running 30 s after its peer got signal " << signal;
    EXPECT_NE(*code, 0);
    EXPECT_LT(absl::Now() - hit, absl::Seconds(timeout_s + 10));
    const std::string log = testing::ReadFileOrEmpty(ranks.logs[0]);
    EXPECT_NE(log.find("collective"), std::string::npos) << log;
    EXPECT_NE(log.find("peer rank 1"), std::string::npos) << log;
  }

  std::vector<std::string> last_events_;
};

TEST_F(ZeroTest, EveryStageAndWorldSizeTrainsLikeOneRank) {
  // The same global batch of 4 samples per step, 20 steps, fp32.
  const auto reference = Train(1, ZeroSpec("w1s0", 0, 4, 1, 20), "w1s0");
  ASSERT_EQ(reference.size(), 20u);
  ExpectClose(reference, Train(2, ZeroSpec("w2s1", 1, 2, 1, 20), "w2s1"), "2 ranks, stage 1");
  ExpectClose(reference, Train(2, ZeroSpec("w2s2", 2, 2, 1, 20), "w2s2"), "2 ranks, stage 2");
  ExpectClose(reference, Train(2, ZeroSpec("w2s3", 3, 2, 1, 20), "w2s3"), "2 ranks, stage 3");
  ExpectClose(reference, Train(4, ZeroSpec("w4s3", 3, 1, 1, 20), "w4s3"), "4 ranks, stage 3");
  // Two micro-batches per step: gradients accumulate in the shards between reduce-scatters.
  ExpectClose(reference, Train(2, ZeroSpec("w2s3ga", 3, 1, 2, 20), "w2s3ga"),
              "2 ranks, stage 3, accumulation 2");
}

TEST_F(ZeroTest, PerRankTrainingStateFollowsTheZeroModel) {
  for (int world : {2, 4}) {
    Train(world, ZeroSpec(absl::StrCat("mem", world), 3, 1, 1, 1), absl::StrCat("mem", world));
    for (int r = 0; r < world; ++r) {
      json memory;
      for (const json& e : ReadEvents(last_events_[r])) {
        if (e["type"] == "memory") memory = e;
      }
      ASSERT_TRUE(memory.is_object()) << "rank " << r;
      const double p = memory["parameters"].get<double>();
      // fp32 master + fp32 gradient + two fp32 Adam moments, of a 1/N slice.
      const double model = 16.0 * p / world;
      const double state = memory["master_bytes"].get<double>() +
                           memory["gradient_bytes"].get<double>() +
                           memory["optimizer_bytes"].get<double>();
      std::cout << "world " << world << " rank " << r << ": state " << state << " B, ZeRO model "
                << model << " B (P = " << p << "), gathered working set at most "
                << memory["peak_working_bytes"].get<double>() << " B\n";
      EXPECT_NEAR(state, model, 0.1 * model) << "rank " << r;
    }
  }
}

TEST_F(ZeroTest, ResumeAfterAKillReproducesTheLossesExactly) {
  const json save = {{"save_strategy", "steps"}, {"save_steps", 4}};
  const auto straight = Train(2, ZeroSpec("straight", 3, 2, 1, 8, save), "straight");
  ASSERT_EQ(straight.size(), 8u);

  const std::string spec = ZeroSpec("killed", 3, 2, 1, 8, save);
  {
    Ranks ranks = Launch(2, spec, "killed-1");
    ASSERT_TRUE(testing::WaitFor(
        [&] { return fs::exists(dir_.path() + "/killed/checkpoint-4/manifest.json"); },
        absl::Minutes(5)));
    for (auto& p : ranks.procs) p->Kill(SIGKILL);
    Wait(ranks, absl::Seconds(30));
  }
  fs::remove_all(dir_.path() + "/killed/checkpoint-8");  // in case the kill came late
  const auto resumed = Train(2, spec, "killed-2");
  const auto events = ReadEvents(last_events_[0]);
  bool from_4 = false;
  for (const json& e : events) {
    if (e["type"] == "status" && e["state"] == "resumed") from_4 = e["step"] == 4;
  }
  EXPECT_TRUE(from_4);
  ASSERT_EQ(resumed.size(), 4u);
  for (const auto& [step, loss] : resumed) {
    EXPECT_EQ(loss, straight.at(step)) << "step " << step;  // bit-identical on CPU in fp32
  }
}

TEST_F(ZeroTest, ACorruptRankFileFallsBackToThePreviousCheckpoint) {
  const json save = {{"save_strategy", "steps"}, {"save_steps", 4}};
  const std::string spec = ZeroSpec("corrupt", 3, 2, 1, 8, save);
  const auto straight = Train(2, spec, "corrupt-1");
  ASSERT_EQ(straight.size(), 8u);
  const std::string shard = dir_.path() + "/corrupt/checkpoint-8/rank-1.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(shard) / 2));
    f.put('\x7f');
  }
  // Asked for 8 steps again: checkpoint-8 is refused, naming the file, and 5..8 run again from 4.
  const auto again = Train(2, spec, "corrupt-2");
  bool warned = false, from_4 = false;
  for (const json& e : ReadEvents(last_events_[0])) {
    if (e["type"] == "warning" && e["message"].get<std::string>().find(
                                      "checkpoint-8/rank-1.safetensors") != std::string::npos) {
      warned = true;
    }
    if (e["type"] == "status" && e["state"] == "resumed") from_4 = e["step"] == 4;
  }
  EXPECT_TRUE(warned) << testing::ReadFileOrEmpty(last_events_[0]);
  EXPECT_TRUE(from_4);
  ASSERT_EQ(again.size(), 4u);
  for (const auto& [step, loss] : again) EXPECT_EQ(loss, straight.at(step)) << "step " << step;
}

TEST_F(ZeroTest, RanksThatSeeDifferentCheckpointsRefuseToResume) {
  const json save = {{"save_strategy", "steps"}, {"save_steps", 2}};
  Train(2, ZeroSpec("seen", 3, 2, 1, 2, save), "seen");
  // Rank 1's output_dir is another, empty directory, as on a node without the shared file system.
  Ranks ranks =
      Launch({ZeroSpec("seen", 3, 2, 1, 4, save), ZeroSpec("unseen", 3, 2, 1, 4, save)}, "split");
  const std::vector<int> codes = Wait(ranks, absl::Minutes(2));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(codes[r], 1) << "rank " << r;
    const std::string log = testing::ReadFileOrEmpty(ranks.logs[r]);
    EXPECT_NE(log.find("different newest checkpoints"), std::string::npos) << log;
  }
}

TEST_F(ZeroTest, MixedTextAndImageBatchesKeepStageThreeRanksInStep) {
  // Every other record loses its image, so at any step one rank may have images and another not.
  std::ofstream mixed(dir_.path() + "/shapes/mixed.jsonl");
  int i = 0;
  for (absl::string_view line :
       absl::StrSplit(testing::ReadFileOrEmpty(dir_.path() + "/shapes/shapes.jsonl"), '\n',
                      absl::SkipEmpty())) {
    json record = json::parse(line);
    if (i++ % 2) record.erase("image");
    mixed << record.dump() << "\n";
  }
  mixed.close();
  const std::string shards = dir_.path() + "/mixed-shards";
  testing::RunResult prep =
      testing::Run({TRAINCTL_CLI_BIN, "prepare", "--input", dir_.path() + "/shapes/mixed.jsonl",
                    "--out", shards, "--tokenizer", tokenizer::testing::QwenTokenizerDir()});
  ASSERT_EQ(prep.exit_code, 0) << prep.err;
  auto spec = [&](const std::string& name, int stage, int batch) {
    const json t = {{"per_device_train_batch_size", batch},
                    {"gradient_accumulation_steps", 1},
                    {"max_steps", 8},
                    {"save_strategy", "no"},
                    {"ddp_timeout", 20}};
    return WriteSpec(name, dir_.path() + "/" + name, t,
                     {{"data_path", shards}, {"deepspeed_config_json", DeepSpeed(stage)}});
  };
  const auto one = Train(1, spec("mixed1", 0, 2), "mixed1");
  ASSERT_EQ(one.size(), 8u);
  ExpectClose(one, Train(2, spec("mixed2", 3, 1), "mixed2"), "2 ranks, stage 3, mixed data");
}

TEST_F(ZeroTest, ACheckpointFromFourRanksResumesOnTwo) {
  const json save = {{"save_strategy", "steps"}, {"save_steps", 4}};
  const auto four = Train(4, ZeroSpec("four", 3, 1, 1, 8, save), "four");
  ASSERT_EQ(four.size(), 8u);
  // The same global batch on 2 ranks: two micro-batches each.
  fs::copy(dir_.path() + "/four", dir_.path() + "/two", fs::copy_options::recursive);
  fs::remove_all(dir_.path() + "/two/checkpoint-8");
  const auto two = Train(2, ZeroSpec("two", 3, 1, 2, 8, save), "two");
  bool from_4 = false;
  for (const json& e : ReadEvents(last_events_[0])) {
    if (e["type"] == "status" && e["state"] == "resumed") from_4 = e["step"] == 4;
  }
  EXPECT_TRUE(from_4);
  std::map<int64_t, double> tail(four.find(5), four.end());
  ExpectClose(tail, two, "resumed on 2 ranks");
  // And to stage 0 on one rank, which holds everything.
  fs::copy(dir_.path() + "/four", dir_.path() + "/one", fs::copy_options::recursive);
  fs::remove_all(dir_.path() + "/one/checkpoint-8");
  ExpectClose(tail, Train(1, ZeroSpec("one", 0, 4, 1, 8, save), "one"), "resumed on 1 rank");
}

TEST_F(ZeroTest, ExportedWeightsReloadToIdenticalLogits) {
  const json save = {{"save_strategy", "steps"}, {"save_steps", 2}};
  Train(2,
        ZeroSpec("exp", 3, 2, 1, 2, save,
                 {{"zero_optimization", {{"stage3_gather_16bit_weights_on_model_save", true}}}}),
        "exp");
  const std::string checkpoint = dir_.path() + "/exp/checkpoint-2";
  ASSERT_TRUE(fs::exists(checkpoint + "/rank-1.safetensors"));
  const std::string out = dir_.path() + "/exported";
  testing::RunResult r = testing::Run({TRAINCTL_TRAINER_BIN, "export", checkpoint, out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(fs::exists(out + "/model.safetensors"));
  ASSERT_TRUE(fs::exists(out + "/config.json"));

  const std::string request = dir_.Write("request.json", R"({"input_ids": [[1, 2, 3, 4, 5, 6]]})");
  for (const std::string& model : {out, checkpoint}) {
    testing::RunResult f = testing::Run({TRAINCTL_TRAINER_BIN, "forward", "--model", model,
                                         "--request", request, "--out", model + "/logits.st"});
    ASSERT_EQ(f.exit_code, 0) << f.err;
  }
  // The offline assembly from the rank files and the engine's gather in training agree exactly.
  EXPECT_EQ(testing::ReadFileOrEmpty(out + "/logits.st"),
            testing::ReadFileOrEmpty(checkpoint + "/logits.st"));
  EXPECT_FALSE(testing::ReadFileOrEmpty(out + "/logits.st").empty());

  // The exported directory is an HF model the trainer starts from: 2 stage-3 ranks, each reading
  // only its slices, train as one rank that loads it whole.
  auto from = [&](const std::string& name, int stage, int batch) {
    const json t = {{"per_device_train_batch_size", batch},
                    {"gradient_accumulation_steps", 1},
                    {"max_steps", 2},
                    {"save_strategy", "no"}};
    return WriteSpec(name, dir_.path() + "/" + name, t,
                     {{"model_name_or_path", out}, {"deepspeed_config_json", DeepSpeed(stage)}});
  };
  ExpectClose(Train(1, from("hf1", 0, 4), "hf1"), Train(2, from("hf2", 3, 2), "hf2"),
              "2 ranks from the exported model");

  testing::RunResult bad =
      testing::Run({TRAINCTL_TRAINER_BIN, "export", dir_.path() + "/nowhere", out + "2"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("nowhere"), std::string::npos) << bad.err;
}

TEST_F(ZeroTest, ARankKilledMidRunFailsTheOthersWithANamedError) {
  ExpectPeerFailureNamed(SIGKILL, /*timeout_s=*/5, "dies");
}

TEST_F(ZeroTest, AHungRankTimesTheOthersOutWithANamedError) {
  ExpectPeerFailureNamed(SIGSTOP, /*timeout_s=*/3, "hangs");
}

TEST_F(ZeroTest, TheSeedsDeepSpeedConfigRunsUnchangedOnTwoCpuRanks) {
  const std::string path = std::string(TRAINCTL_SOURCE_DIR) + "/configs/ds_zero3_bf16.json";
  const std::string text = testing::ReadFileOrEmpty(path);
  ASSERT_FALSE(text.empty()) << path;
  const std::string spec = WriteSpec("seed", dir_.path() + "/seed",
                                     {{"per_device_train_batch_size", 2},
                                      {"gradient_accumulation_steps", 2},
                                      {"max_steps", 3},
                                      {"bf16", true},
                                      {"gradient_checkpointing", true},
                                      {"save_strategy", "steps"},
                                      {"save_steps", 3}},
                                     {{"deepspeed", path}, {"deepspeed_config_json", text}});
  const auto losses = Train(2, spec, "seed");
  ASSERT_EQ(losses.size(), 3u);
  for (const auto& [step, loss] : losses) EXPECT_TRUE(std::isfinite(loss)) << step;
  // stage3_gather_16bit_weights_on_model_save: the checkpoint holds the bf16 model for HF.
  const std::string config =
      testing::ReadFileOrEmpty(dir_.path() + "/seed/checkpoint-3/config.json");
  EXPECT_NE(config.find("bfloat16"), std::string::npos) << config;
  EXPECT_TRUE(fs::exists(dir_.path() + "/seed/checkpoint-3/rank-1.safetensors"));
}

}  // namespace
}  // namespace trainctl
