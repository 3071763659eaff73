#include "worker/trainer/checkpoint/trainer_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "worker/trainer/model/state_dict_adapter.h"

namespace trainctl::trainer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kManifest[] = "manifest.json";
constexpr char kState[] = "trainer_state.json";
constexpr char kOptimizer[] = "optimizer.pt";
constexpr char kRng[] = "rng.pt";

absl::StatusOr<std::string> ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::Status WriteAll(const fs::path& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
  out.flush();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

uint64_t Fnv1a64(const std::string& data) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Runs a torch call, turning its exception into a status that says what was being done.
template <typename Fn>
absl::Status TorchCall(const std::string& what, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  }
}

absl::Status WriteManifest(const fs::path& dir, int64_t step) {
  json files = json::object();
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name == kManifest || !entry.is_regular_file()) continue;
    auto data = ReadAll(entry.path());
    if (!data.ok()) return data.status();
    files[name] = {{"size", data->size()}, {"fnv1a64", absl::StrFormat("%016x", Fnv1a64(*data))}};
  }
  const json manifest = {{"format", "trainctl-checkpoint/1"}, {"step", step}, {"files", files}};
  const fs::path tmp = dir / (std::string(kManifest) + ".tmp");
  if (auto s = WriteAll(tmp, manifest.dump(2)); !s.ok()) return s;
  fs::rename(tmp, dir / kManifest);
  return absl::OkStatus();
}

absl::Status VerifyManifest(const fs::path& dir) {
  auto text = ReadAll(dir / kManifest);
  if (!text.ok()) {
    return absl::NotFoundError(
        absl::StrCat(dir.string(), ": no ", kManifest, " (incomplete checkpoint)"));
  }
  const json manifest = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object() || !manifest.contains("files") || !manifest["files"].is_object()) {
    return absl::DataLossError(absl::StrCat((dir / kManifest).string(), ": malformed manifest"));
  }
  for (const auto& [name, meta] : manifest["files"].items()) {
    auto data = ReadAll(dir / name);
    if (!data.ok()) return absl::DataLossError(absl::StrCat((dir / name).string(), ": missing"));
    if (!meta.contains("size") || meta["size"] != data->size() ||
        meta.value("fnv1a64", "") != absl::StrFormat("%016x", Fnv1a64(*data))) {
      return absl::DataLossError(
          absl::StrCat((dir / name).string(), ": size or checksum does not match ", kManifest));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SaveCheckpoint(const std::string& output_dir, const TrainerState& state,
                                           const model::Qwen2VLForConditionalGeneration& model,
                                           torch::optim::Optimizer& optimizer) {
  const fs::path dir = fs::path(output_dir) / absl::StrCat("checkpoint-", state.global_step);
  std::error_code ec;
  fs::remove_all(dir, ec);  // a half-written one from a crashed attempt
  fs::create_directories(dir, ec);
  if (ec)
    return absl::UnavailableError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));

  if (auto s = model::SaveHfCheckpoint(model, dir.string()); !s.ok()) return s;
  absl::Status s = TorchCall("saving " + (dir / kOptimizer).string(), [&] {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    archive.save_to((dir / kOptimizer).string());
  });
  if (!s.ok()) return s;
  s = TorchCall("saving " + (dir / kRng).string(), [&] {
    torch::save(at::detail::getDefaultCPUGenerator().get_state(), (dir / kRng).string());
  });
  if (!s.ok()) return s;
  const json trainer_state = {
      {"global_step", state.global_step},
      {"epoch", state.epoch},
      {"loader", {{"epoch", state.loader.epoch}, {"index", state.loader.index}}}};
  if (s = WriteAll(dir / kState, trainer_state.dump(2)); !s.ok()) return s;
  if (s = WriteManifest(dir, state.global_step); !s.ok()) return s;
  return dir.string();
}

absl::StatusOr<TrainerState> LoadCheckpoint(const std::string& dir_text,
                                            model::Qwen2VLForConditionalGeneration& model,
                                            torch::optim::Optimizer& optimizer) {
  const fs::path dir(dir_text);
  if (auto s = VerifyManifest(dir); !s.ok()) return s;
  auto state_text = ReadAll(dir / kState);
  if (!state_text.ok()) return state_text.status();
  const json j = json::parse(*state_text, nullptr, false);
  if (!j.is_object() || !j.contains("global_step") || !j.contains("loader")) {
    return absl::DataLossError(absl::StrCat((dir / kState).string(), ": malformed"));
  }
  TrainerState state;
  state.global_step = j["global_step"].get<int64_t>();
  state.epoch = j.value("epoch", 0.0);
  state.loader.epoch = j["loader"].value("epoch", int64_t{0});
  state.loader.index = j["loader"].value("index", int64_t{0});

  if (auto s = model::LoadHfCheckpoint(model, dir.string()); !s.ok()) return s;
  absl::Status s = TorchCall("loading " + (dir / kOptimizer).string(), [&] {
    torch::serialize::InputArchive archive;
    archive.load_from((dir / kOptimizer).string());
    optimizer.load(archive);
  });
  if (!s.ok()) return s;
  s = TorchCall("loading " + (dir / kRng).string(), [&] {
    torch::Tensor rng;
    torch::load(rng, (dir / kRng).string());
    at::Generator generator = at::detail::getDefaultCPUGenerator();  // a handle
    generator.set_state(rng);
  });
  if (!s.ok()) return s;
  return state;
}

std::optional<std::string> FindLatestCheckpoint(const std::string& output_dir,
                                                std::vector<std::string>* skipped) {
  std::map<int64_t, fs::path, std::greater<>> by_step;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t step;
    if (entry.is_directory() && name.rfind("checkpoint-", 0) == 0 &&
        absl::SimpleAtoi(name.substr(11), &step)) {
      by_step[step] = entry.path();
    }
  }
  for (const auto& [step, dir] : by_step) {
    if (absl::Status s = VerifyManifest(dir); !s.ok()) {
      if (skipped != nullptr) skipped->push_back(std::string(s.message()));
      continue;
    }
    return dir.string();
  }
  return std::nullopt;
}

}  // namespace trainctl::trainer
