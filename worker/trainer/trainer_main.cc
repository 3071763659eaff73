// trainctl-trainer: one training rank. Runs under trainctl-worker, which passes the launch the
// coordinator decided (a LaunchTask as JSON) and reads events from TRAINCTL_EVENT_FD, or alone for
// debugging with a job spec, which it validates as `trainctl validate` does.
//
//   trainctl-trainer train --launch LAUNCH.json | --spec SPEC.json [--events FILE] [--threads N]
//                          [--no_resume]
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
#include "absl/strings/str_join.h"
#include "common/build_info.h"
#include "common/job_spec.h"
#include "common/json_proto.h"
#include "common/rank_env.h"
#include "common/status_macros.h"
#include "common/verb_args.h"
#include "worker/trainer/checkpoint/trainer_checkpoint.h"
#include "worker/trainer/event_sink.h"
#include "worker/trainer/forward_tool.h"
#include "worker/trainer/generate_tool.h"
#include "worker/trainer/model/fused_ops.h"
#include "worker/trainer/model/host_runtime.h"
#ifdef TRAINCTL_WITH_SERVE
#include "worker/trainer/serve/serve_tool.h"
#endif
#include "trainctl/v1/worker.pb.h"
#include "worker/trainer/stages/loop.h"
#include "worker/trainer/trainer_failure.h"

namespace trainctl::trainer {
namespace {

constexpr char kUsage[] =
    "usage: trainctl-trainer train --launch LAUNCH.json | --spec SPEC.json [--events FILE]\n"
    "                              [--threads N] [--no_resume]\n"
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

// Each verb's options (common/verb_args.h); a switch is given as `--name`.
const std::map<std::string, std::vector<OptionSpec>>& VerbOptions() {
  static const auto* const verbs = [] {
    const std::vector<OptionSpec> model_options = {
        {"model", "", true}, {"device", "", true}, {"dtype", "", true}, {"attention", "", true}};
    auto with_model = [&](std::vector<OptionSpec> own) {
      own.insert(own.end(), model_options.begin(), model_options.end());
      return own;
    };
    return new std::map<std::string, std::vector<OptionSpec>>{
        {"train",
         {{"launch", "", true},
          {"spec", "", true},
          {"events", "", true},
          {"threads", "", true},
          {"no_resume", "", false}}},
        {"forward", with_model({{"request", "", true}, {"out", "", true}})},
        {"generate", with_model({{"request", "", true},
                                 {"out", "", true},
                                 {"max_new_tokens", "", true},
                                 {"temperature", "", true},
                                 {"top_p", "", true},
                                 {"top_k", "", true},
                                 {"seed", "", true}})},
        {"export", {{"dtype", "", true}}},
        {"serve", with_model({{"listen", "", true},
                              {"max_batch", "", true},
                              {"batch_window_ms", "", true},
                              {"served_model_name", "", true},
                              {"image_root", "", true},
                              {"max_tokens", "", true},
                              {"min_pixels", "", true},
                              {"max_pixels", "", true},
                              {"max_body_mb", "", true},
                              {"request_timeout_s", "", true},
                              {"read_timeout_s", "", true}})},
    };
  }();
  return *verbs;
}

absl::StatusOr<std::string> ReadText(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A spec given by hand: validated and its DeepSpeed config resolved here, as `trainctl validate`
// would, since no coordinator did.
absl::StatusOr<TrainRun> RunFromSpec(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadText(path, "spec"));
  ASSIGN_OR_RETURN(const trainctl::v1::JobSpec spec, ParseJobSpec(text, SpecFormat::kJson, path));
  ASSIGN_OR_RETURN(ValidatedJobSpec validated, ValidateJobSpec(spec));
  TrainRun run;
  run.spec = std::move(validated.spec);
  run.deepspeed_config = std::move(validated.resolved_deepspeed_config_json);
  return run;
}

// The launch the coordinator decided, as the worker wrote it: taken as it is (the coordinator
// validated the spec, applied defaults and remedies, resolved the DeepSpeed config), only checked
// against the environment the same worker set.
absl::StatusOr<TrainRun> RunFromLaunch(const std::string& path, const RankEnv& env) {
  ASSIGN_OR_RETURN(const std::string text, ReadText(path, "launch file"));
  ASSIGN_OR_RETURN(const nlohmann::json doc, ParseJsonText(text, path));
  trainctl::v1::LaunchTask launch;
  std::vector<std::string> errors;
  DecodeJsonIntoMessage(doc, "launch", &launch, &errors);
  if (!errors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", absl::StrJoin(errors, "; ")));
  }
  if (launch.world_size() != env.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the launch is for world size ",
                                                   launch.world_size(), ", WORLD_SIZE is ",
                                                   env.world_size));
  }
  TrainRun run;
  run.spec = std::move(*launch.mutable_spec());
  run.deepspeed_config = std::move(*launch.mutable_resolved_deepspeed_config_json());
  return run;
}

int Train(const std::map<std::string, std::string>& flags) {
  if (flags.count("spec") == flags.count("launch")) {  // exactly one of the two
    std::cerr << kUsage;
    return 2;
  }
  // The one read of the rank's environment (common/rank_env.h), passed down from here. Its event
  // pipe is read first, so that an error in the rest is reported on it.
  RankEnv env;
  const absl::Status env_status = RankEnv::FromProcess(&env);
  auto sink =
      JsonLinesEventSink::Open(env.event_fd, flags.count("events") ? flags.at("events") : "");
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
      events->Emit("warning", {{"kind", "oom"},
                               {"rank", env.rank},
                               {"device", oom->device},
                               {"bytes", oom->bytes},
                               {"message", std::string(s.message())}});
    }
    events->Emit("status", {{"state", "failed"}, {"message", std::string(s.message())}});
    std::cerr << "trainctl-trainer: " << s.message() << "\n";
    return TrainerExitCode(s);
  };
  if (!env_status.ok()) return fail(env_status);
  // Tests only: an address-space limit on this rank, so that an allocation fails for real.
  if (env.address_space_limit > 0) {
    rlimit rl{};
    rl.rlim_cur = rl.rlim_max = env.address_space_limit;
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
  absl::StatusOr<TrainRun> run = flags.count("launch") ? RunFromLaunch(flags.at("launch"), env)
                                                       : RunFromSpec(flags.at("spec"));
  if (!run.ok()) return fail(run.status());
  run->resume = !flags.count("no_resume");
  run->env = env;
  events->Emit(
      "status",
      {{"state", "running"}, {"kind", JobKindName(run->spec.kind())}, {"name", run->spec.name()}});
  absl::StatusOr<TrainResult> result;
  try {
    result = RunTraining(*run, events);
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
  // TRAINCTL_FUSED_KERNELS=0 (a job's env may set it), for every verb: the decoder's RMSNorm,
  // rotary and SwiGLU as LibTorch's composite ops instead of the fused CUDA kernels
  // (model/fused_ops.h). `train` reads the rest of the rank's environment itself (RankEnv).
  if (const char* fused = std::getenv("TRAINCTL_FUSED_KERNELS");
      fused && std::string(fused) == "0") {
    trainctl::model::SetFusedKernelsEnabled(false);
  }
  const auto verb_options = trainctl::trainer::VerbOptions().find(verb);
  if (verb_options == trainctl::trainer::VerbOptions().end()
#ifndef TRAINCTL_WITH_SERVE
      || verb == "serve"
#endif
  ) {
    std::cerr << "trainctl-trainer: unknown verb '" << verb << "'\n" << trainctl::trainer::kUsage;
    return 2;
  }
  auto parsed = trainctl::ParseArgs({argv + 2, argv + argc}, verb_options->second,
                                    /*allow_passthrough=*/false);
  // export takes CHECKPOINT_DIR OUT_DIR; every other verb options only.
  const size_t positional = verb == "export" ? 2 : 0;
  if (parsed.ok() && parsed->positional.size() != positional) {
    parsed = absl::InvalidArgumentError(
        positional == 0 ? absl::StrCat("unexpected argument '", parsed->positional.front(), "'")
                        : "export takes CHECKPOINT_DIR OUT_DIR");
  }
  if (!parsed.ok()) {
    std::cerr << "trainctl-trainer: " << parsed.status().message() << "\n"
              << trainctl::trainer::kUsage;
    return 2;
  }
  const std::map<std::string, std::string>& flags = parsed->options;
  if (verb == "export") {
    return trainctl::trainer::Export(parsed->positional[0], parsed->positional[1], flags);
  }
  if (verb == "train") return trainctl::trainer::Train(flags);
  if (verb == "forward") return trainctl::trainer::Forward(flags);
  if (verb == "generate") return trainctl::trainer::Generate(flags);
#ifdef TRAINCTL_WITH_SERVE
  return trainctl::serve::RunServe(flags);
#else
  return 2;  // not reached: serve is an unknown verb in this build
#endif
}
