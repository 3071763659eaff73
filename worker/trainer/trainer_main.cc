// trainctl-trainer: one training rank. Runs alone for debugging, or under trainctl-worker, which
// passes the resolved job spec and reads events from TRAINCTL_EVENT_FD.
//
//   trainctl-trainer train --spec SPEC.json [--events FILE] [--threads N] [--no_resume]
//   trainctl-trainer forward --model DIR --request REQ.json --out OUT.safetensors
//   trainctl-trainer generate --model DIR --request REQ.json --max_new_tokens N --out OUT.json
//   trainctl-trainer serve --model DIR --listen HOST:PORT [--max_batch N]  (CPU builds)
//   trainctl-trainer --help | -h | help  (also --help after a verb): the usage, on stdout
// forward and generate read the same request file (tool_request.h).
#include <sys/resource.h>
#include <torch/torch.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "common/job_spec.h"
#include "worker/trainer/checkpoint/trainer_checkpoint.h"
#include "worker/trainer/event_sink.h"
#include "worker/trainer/forward_tool.h"
#include "worker/trainer/generate_tool.h"
#include "worker/trainer/model/fused_ops.h"
#include "worker/trainer/model/host_runtime.h"
#ifdef TRAINCTL_WITH_SERVE
#include "worker/trainer/serve/serve_tool.h"
#endif
#include "worker/trainer/stages/loop.h"
#include "worker/trainer/trainer_failure.h"

namespace trainctl::trainer {
namespace {

constexpr char kUsage[] =
    "usage: trainctl-trainer train --spec SPEC.json [--events FILE] [--threads N] [--no_resume]\n"
    "       trainctl-trainer forward --model DIR --request REQ.json --out OUT.safetensors\n"
    "                                [--device cpu|cuda] [--dtype float32|bfloat16]\n"
    "                                [--attention auto|eager|sdpa]\n"
    "       trainctl-trainer generate --model DIR --request REQ.json --max_new_tokens N\n"
    "                                 --out OUT.json [--temperature T (0: greedy, default)]\n"
    "                                 [--top_p P] [--top_k K] [--seed S] [--device ..]\n"
    "                                 [--dtype ..] [--attention ..]\n"
    "       trainctl-trainer export CHECKPOINT_DIR OUT_DIR [--dtype float32|bfloat16|float16]\n"
    "       trainctl-trainer serve --model DIR --listen HOST:PORT [--max_batch N]\n"
    "                              [--batch_window_ms MS] [--served_model_name NAME]\n"
    "                              [--image_root DIR] [--max_tokens N] [--device ..] [--dtype ..]\n"
    "                              [--min_pixels N] [--max_pixels N] [--max_body_mb N]\n"
    "                              [--request_timeout_s S] [--read_timeout_s S]\n";

// `--name value` / `--name=value` / bare `--switch` (value "true").
absl::StatusOr<std::map<std::string, std::string>> ParseFlags(
    const std::vector<std::string>& args) {
  std::map<std::string, std::string> flags;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].rfind("--", 0) != 0)
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", args[i], "'"));
    std::string name = args[i].substr(2), value = "true";
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      value = args[++i];
    }
    flags[name] = value;
  }
  return flags;
}

absl::StatusOr<ValidatedJobSpec> LoadSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read spec ", path));
  std::stringstream text;
  text << in.rdbuf();
  auto spec = ParseJobSpec(text.str(), SpecFormat::kJson, path);
  if (!spec.ok()) return spec.status();
  return ValidateJobSpec(*spec);
}

int Train(const std::map<std::string, std::string>& flags) {
  if (!flags.count("spec")) {
    std::cerr << kUsage;
    return 2;
  }
  auto sink = JsonLinesEventSink::FromEnvironment(flags.count("events") ? flags.at("events") : "");
  if (!sink.ok()) {
    std::cerr << "trainctl-trainer: " << sink.status().message() << "\n";
    return 1;
  }
  ConsoleEchoEventSink console(sink->get());
  EventSink* events = &console;
  // The exit code says why when a remedy exists (common/trainer_exit_codes.h); an out-of-memory
  // error is also a typed warning naming the rank (a loss spike's the loop emits itself).
  auto fail = [&](const absl::Status& s) {
    if (std::optional<OutOfMemory> oom = ParseOutOfMemory(s.message())) {
      const char* rank = std::getenv("RANK");
      events->Emit("warning", {{"kind", "oom"},
                               {"rank", rank != nullptr ? std::atoi(rank) : 0},
                               {"device", oom->device},
                               {"bytes", oom->bytes},
                               {"message", std::string(s.message())}});
    }
    events->Emit("status", {{"state", "failed"}, {"message", std::string(s.message())}});
    std::cerr << "trainctl-trainer: " << s.message() << "\n";
    return TrainerExitCode(s);
  };
  // Tests only: an address-space limit on this rank, so that an allocation fails for real.
  if (const char* limit = std::getenv("TRAINCTL_TEST_ADDRESS_SPACE_LIMIT"); limit && *limit) {
    rlimit rl{};
    if (!absl::SimpleAtoi(limit, &rl.rlim_cur) || rl.rlim_cur == 0) {
      return fail(absl::InvalidArgumentError(
          "TRAINCTL_TEST_ADDRESS_SPACE_LIMIT: must be a positive number of bytes"));
    }
    rl.rlim_max = rl.rlim_cur;
    if (setrlimit(RLIMIT_AS, &rl) != 0) {
      return fail(absl::InternalError(absl::StrCat("setrlimit(RLIMIT_AS): ", strerror(errno))));
    }
  }
  if (flags.count("threads")) {
    int threads = 0;
    if (!absl::SimpleAtoi(flags.at("threads"), &threads) || threads < 1) {
      return fail(absl::InvalidArgumentError("--threads: must be a positive integer"));
    }
    model::SetCpuThreads(threads);
  }
  auto spec = LoadSpec(flags.at("spec"));
  if (!spec.ok()) return fail(spec.status());
  const std::string kind = JobKindName(spec->spec.kind());
  events->Emit("status", {{"state", "running"}, {"kind", kind}, {"name", spec->spec.name()}});
  TrainRun run{spec->spec, /*resume=*/!flags.count("no_resume")};
  absl::StatusOr<TrainResult> result;
  try {
    result = RunTraining(run, events);
  } catch (const std::bad_alloc& e) {  // outside the stages' own c10::Error handlers
    result = absl::ResourceExhaustedError(absl::StrCat("std::bad_alloc: ", e.what()));
  } catch (const c10::Error& e) {
    result = absl::InternalError(e.what_without_backtrace());
  }
  if (!result.ok()) return fail(result.status());
  events->Emit("status", {{"state", "succeeded"},
                          {"steps", result->steps},
                          {"loss", result->last_loss},
                          {"checkpoint", result->last_checkpoint}});
  return 0;
}

int Forward(const std::map<std::string, std::string>& flags) {
  for (const char* required : {"model", "request", "out"}) {
    if (!flags.count(required)) {
      std::cerr << kUsage;
      return 2;
    }
  }
  auto flag = [&flags](const char* name) {
    return flags.count(name) ? flags.at(name) : std::string();
  };
  auto options = model::ParseForwardOptions(flag("device"), flag("dtype"), flag("attention"));
  if (!options.ok()) {
    std::cerr << "trainctl-trainer forward: " << options.status().message() << "\n";
    return 2;
  }
  absl::Status s = RunForward(flags.at("model"), flags.at("request"), flags.at("out"), *options);
  if (!s.ok()) {
    std::cerr << "trainctl-trainer forward: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

// KV-cached generation on a JSON request (generate_tool.h).
int Generate(const std::map<std::string, std::string>& flags) {
  for (const char* required : {"model", "request", "out", "max_new_tokens"}) {
    if (!flags.count(required)) {
      std::cerr << kUsage;
      return 2;
    }
  }
  auto options = ParseGenerateToolOptions(flags);
  if (!options.ok()) {
    std::cerr << "trainctl-trainer generate: " << options.status().message() << "\n";
    return 2;
  }
  absl::Status s = RunGenerate(flags.at("model"), flags.at("request"), flags.at("out"), *options);
  if (!s.ok()) {
    std::cerr << "trainctl-trainer generate: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

// The full model of a (sharded) checkpoint in HF's layout, assembled offline.
int Export(const std::string& checkpoint, const std::string& out,
           const std::map<std::string, std::string>& flags) {
  torch::ScalarType dtype = torch::kFloat32;
  if (flags.count("dtype")) {
    const std::string& name = flags.at("dtype");
    if (name == "bfloat16" || name == "bf16") {
      dtype = torch::kBFloat16;
    } else if (name == "float16" || name == "fp16") {
      dtype = torch::kHalf;
    } else if (name != "float32" && name != "fp32") {
      std::cerr << "trainctl-trainer export: --dtype: one of float32, bfloat16, float16; got '"
                << name << "'\n";
      return 2;
    }
  }
  absl::Status s = ExportCheckpoint(checkpoint, out, dtype);
  if (!s.ok()) {
    std::cerr << "trainctl-trainer export: " << s.message() << "\n";
    return 1;
  }
  std::cout << "exported " << checkpoint << " to " << out << "\n";
  return 0;
}

}  // namespace
}  // namespace trainctl::trainer

int main(int argc, char** argv) {
  trainctl::model::KeepTensorMemoryInTheHeap();
  // TRAINCTL_FUSED_KERNELS=0 (a job's env may set it): the decoder's RMSNorm, rotary and SwiGLU as
  // LibTorch's composite ops instead of the fused CUDA kernels (model/fused_ops.h).
  if (const char* fused = std::getenv("TRAINCTL_FUSED_KERNELS");
      fused && std::string(fused) == "0") {
    trainctl::model::SetFusedKernelsEnabled(false);
  }
  if (argc < 2) {
    std::cerr << trainctl::trainer::kUsage;
    return 2;
  }
  const std::string verb = argv[1];
  if (verb == "--version") {
    std::cout << trainctl::VersionText("trainctl-trainer");
    return 0;
  }
  const auto asks_help = [](const std::string& arg) { return arg == "--help" || arg == "-h"; };
  if (asks_help(verb) || verb == "help" || (argc > 2 && asks_help(argv[2]))) {
    std::cout << trainctl::trainer::kUsage;
    return 0;
  }
  if (verb == "export") {
    if (argc < 4 || argv[2][0] == '-' || argv[3][0] == '-') {
      std::cerr << trainctl::trainer::kUsage;
      return 2;
    }
    auto export_flags = trainctl::trainer::ParseFlags({argv + 4, argv + argc});
    if (!export_flags.ok()) {
      std::cerr << "trainctl-trainer: " << export_flags.status().message() << "\n"
                << trainctl::trainer::kUsage;
      return 2;
    }
    return trainctl::trainer::Export(argv[2], argv[3], *export_flags);
  }
  auto flags = trainctl::trainer::ParseFlags({argv + 2, argv + argc});
  if (!flags.ok()) {
    std::cerr << "trainctl-trainer: " << flags.status().message() << "\n"
              << trainctl::trainer::kUsage;
    return 2;
  }
  if (verb == "train") return trainctl::trainer::Train(*flags);
  if (verb == "forward") return trainctl::trainer::Forward(*flags);
  if (verb == "generate") return trainctl::trainer::Generate(*flags);
#ifdef TRAINCTL_WITH_SERVE
  if (verb == "serve") return trainctl::serve::RunServe(*flags);
#endif
  std::cerr << "trainctl-trainer: unknown verb '" << verb << "'\n" << trainctl::trainer::kUsage;
  return 2;
}
