#include "worker/trainer/checkpoint/trainer_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/trainer/model/safetensors.h"
#include "worker/trainer/model/state_dict_adapter.h"

namespace trainctl::trainer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kManifest[] = "manifest.json";
constexpr char kState[] = "trainer_state.json";
constexpr char kFormat[] = "trainctl-checkpoint/2";
// What HF tokenizers ship next to the weights; copied along so a checkpoint or export is a model
// directory transformers can load whole.
constexpr const char* kTokenizerFiles[] = {"tokenizer.json",
                                           "tokenizer_config.json",
                                           "vocab.json",
                                           "merges.txt",
                                           "special_tokens_map.json",
                                           "added_tokens.json",
                                           "preprocessor_config.json",
                                           "chat_template.json",
                                           "generation_config.json"};

std::string RankFile(int rank) { return absl::StrCat("rank-", rank, ".safetensors"); }

absl::StatusOr<std::string> ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::Status WriteAll(const fs::path& path, const std::string& data) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << data;
    out.flush();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp.string()));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec)
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp.string(), ": ", ec.message()));
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

absl::Status WriteManifest(const fs::path& dir, int64_t step) {
  json files = json::object();
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name == kManifest || !entry.is_regular_file()) continue;
    ASSIGN_OR_RETURN(const std::string data, ReadAll(entry.path()));
    files[name] = {{"size", data.size()}, {"fnv1a64", absl::StrFormat("%016x", Fnv1a64(data))}};
  }
  const json manifest = {{"format", kFormat}, {"step", step}, {"files", files}};
  return WriteAll(dir / kManifest, manifest.dump(2));
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

absl::StatusOr<json> ReadJson(const fs::path& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadAll(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(absl::StrCat(path.string(), ": malformed JSON"));
  }
  return j;
}

void CopyTokenizerFiles(const fs::path& from, const fs::path& to) {
  if (from.empty() || !fs::is_directory(from)) return;
  for (const char* name : kTokenizerFiles) {
    std::error_code ec;
    if (fs::exists(from / name)) {
      fs::copy_file(from / name, to / name, fs::copy_options::overwrite_existing, ec);
    }
  }
}

// The saved ranks' files of one checkpoint, read by element range of a unit's flat buffer.
class SavedShards {
 public:
  static absl::StatusOr<SavedShards> Open(const fs::path& dir, int world) {
    SavedShards s;
    for (int r = 0; r < world; ++r) {
      const fs::path path = dir / RankFile(r);
      ASSIGN_OR_RETURN(auto file, model::SafetensorsFile::Open(path.string()));
      auto it = file->metadata().find("ranges");
      json ranges = it == file->metadata().end()
                        ? json()
                        : json::parse(it->second, nullptr, /*allow_exceptions=*/false);
      if (!ranges.is_object()) {
        return absl::DataLossError(absl::StrCat(path.string(), ": no unit ranges in its metadata"));
      }
      s.ranges_.push_back(std::move(ranges));
      s.files_.push_back(std::move(file));
    }
    return s;
  }

  const model::SafetensorsFile& file(int rank) const { return *files_[rank]; }

  // Elements [begin, end) of `unit`'s `kind` buffer, from whichever ranks hold them.
  absl::StatusOr<torch::Tensor> Read(const std::string& unit, const std::string& kind,
                                     int64_t begin, int64_t end) const {
    torch::Tensor out = torch::empty({end - begin}, torch::kFloat32);
    int64_t covered = 0;
    for (size_t r = 0; r < files_.size(); ++r) {
      if (!ranges_[r].contains(unit)) continue;
      const int64_t lo = ranges_[r][unit][0].get<int64_t>();
      const int64_t hi = ranges_[r][unit][1].get<int64_t>();
      const int64_t a = std::max(lo, begin), b = std::min(hi, end);
      if (a >= b) continue;
      ASSIGN_OR_RETURN(torch::Tensor t, files_[r]->Get(unit + "." + kind, torch::kFloat32));
      if (t.numel() != hi - lo) {
        return absl::DataLossError(absl::StrCat(files_[r]->path(), ": ", unit, ".", kind, " has ",
                                                t.numel(), " elements, its range says ", hi - lo));
      }
      out.narrow(0, a - begin, b - a).copy_(t.narrow(0, a - lo, b - a));
      covered += b - a;
    }
    if (covered != end - begin) {
      return absl::DataLossError(absl::StrCat("no saved rank holds elements [", begin, ", ", end,
                                              ") of ", unit, ".", kind));
    }
    return out;
  }

 private:
  std::vector<std::unique_ptr<model::SafetensorsFile>> files_;
  std::vector<json> ranges_;
};

}  // namespace

absl::StatusOr<std::string> SaveCheckpoint(const std::string& output_dir, const TrainerState& state,
                                           zero::Engine& engine, const SaveOptions& options) {
  zero::Comm& comm = engine.comm();
  const fs::path dir = fs::path(output_dir) / absl::StrCat("checkpoint-", state.global_step);
  std::error_code ec;
  if (comm.rank() == 0) fs::remove_all(dir, ec);  // a half-written one from a crashed attempt
  comm.Barrier("before writing " + dir.string());
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  }

  zero::Engine::ShardState shards = engine.SaveShards();
  std::vector<model::NamedTensor> tensors;
  for (auto& [name, t] : shards.tensors) tensors.push_back({name, t});
  torch::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  tensors.push_back({"rng.cpu", rng});
  const json loader = {{"epoch", state.loader.epoch}, {"index", state.loader.index}};
  RETURN_IF_ERROR(
      model::WriteSafetensors((dir / RankFile(comm.rank())).string(), tensors,
                              {{"ranges", shards.ranges.dump()}, {"loader", loader.dump()}}));

  // The whole model in HF's layout, in the compute dtype (the 16-bit weights with bf16/fp16):
  // every rank takes part in the gathers, rank 0 alone keeps and writes the result.
  std::vector<std::pair<std::string, torch::Tensor>> full;
  if (options.write_hf_weights) {
    full = engine.GatherFullWeights(engine.options().compute_dtype, comm.rank() == 0);
  }
  if (comm.rank() == 0) {
    if (options.write_hf_weights) {
      std::vector<model::NamedTensor> weights;
      for (auto& [name, t] : full) weights.push_back({name, t});
      model::SaveOptions save;
      save.dtype = engine.options().compute_dtype;
      RETURN_IF_ERROR(
          model::SaveHfTensors(engine.model().config(), std::move(weights), dir.string(), save));
    }
    CopyTokenizerFiles(options.tokenizer_dir, dir);
    const json trainer_state = {
        {"global_step", state.global_step},
        {"epoch", state.epoch},
        {"world_size", comm.world_size()},
        {"data_ranks", options.data_ranks > 0 ? options.data_ranks : comm.world_size()},
        {"zero_stage", engine.options().stage},
        {"engine", shards.engine},
        {"model_config", json::parse(model::Qwen2VLConfigToJson(engine.model().config()))},
        {"layout", engine.Layout()}};
    RETURN_IF_ERROR(WriteAll(dir / kState, trainer_state.dump(1)));
  }
  full.clear();
  comm.Barrier("after writing " + dir.string());
  if (comm.rank() == 0) RETURN_IF_ERROR(WriteManifest(dir, state.global_step));
  comm.Barrier("after the manifest of " + dir.string());
  return dir.string();
}

absl::StatusOr<TrainerState> LoadCheckpoint(const std::string& dir_text, zero::Engine& engine,
                                            int data_ranks) {
  const fs::path dir(dir_text);
  RETURN_IF_ERROR(VerifyManifest(dir));
  ASSIGN_OR_RETURN(const json j, ReadJson(dir / kState));
  if (!j.contains("global_step") || !j.contains("world_size") || !j.contains("layout")) {
    return absl::DataLossError(absl::StrCat((dir / kState).string(), ": malformed"));
  }
  const int saved_world = j["world_size"].get<int>();
  // The same model: every unit's parameters, in order.
  const json layout = engine.Layout();
  if (layout != j["layout"]) {
    for (size_t i = 0; i < layout.size(); ++i) {
      if (i >= j["layout"].size() || layout[i] != j["layout"][i]) {
        return absl::FailedPreconditionError(absl::StrCat(
            dir.string(), ": the checkpoint's unit ",
            i < j["layout"].size() ? j["layout"][i].value("unit", "?") : std::string("(none)"),
            " does not match the model's ", layout[i]["unit"].get<std::string>(),
            " (another model config?)"));
      }
    }
    return absl::FailedPreconditionError(
        absl::StrCat(dir.string(), ": the checkpoint has more units than the model"));
  }
  ASSIGN_OR_RETURN(SavedShards saved, SavedShards::Open(dir, saved_world));
  RETURN_IF_ERROR(
      engine.LoadShards([&](const std::string& unit, const std::string& kind, int64_t begin,
                            int64_t end) { return saved.Read(unit, kind, begin, end); },
                        j.value("engine", json::object())));

  zero::Comm& comm = engine.comm();
  TrainerState state;
  state.global_step = j["global_step"].get<int64_t>();
  state.epoch = j.value("epoch", 0.0);
  // This rank's loader position; when the data goes to another number of ranks, the same number
  // of samples dealt out again over the new ones (every rank holds the same count).
  const int saved_data = j.value("data_ranks", saved_world);
  const int data = data_ranks > 0 ? data_ranks : comm.world_size();
  const int source = saved_world == comm.world_size() ? comm.rank() : 0;
  const auto& meta = saved.file(source).metadata();
  auto it = meta.find("loader");
  const json loader = it == meta.end() ? json() : json::parse(it->second, nullptr, false);
  if (!loader.is_object()) {
    return absl::DataLossError(
        absl::StrCat((dir / RankFile(source)).string(), ": no loader position in its metadata"));
  }
  state.loader.epoch = loader.value("epoch", int64_t{0});
  state.loader.index = loader.value("index", int64_t{0});
  if (saved_data != data) {
    const int64_t dealt = state.loader.index * saved_data;
    if (dealt % data != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir.string(), ": ", dealt, " samples of epoch ", state.loader.epoch,
                       " were dealt to ", saved_data, " ranks; that does not divide among ", data));
    }
    state.loader.index = dealt / data;
  }
  if (saved_world == comm.world_size()) {
    ASSIGN_OR_RETURN(torch::Tensor rng, saved.file(comm.rank()).Get("rng.cpu"));
    at::Generator generator = at::detail::getDefaultCPUGenerator();  // a handle
    generator.set_state(rng.clone());
  }
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

absl::Status ExportCheckpoint(const std::string& dir_text, const std::string& out_dir,
                              torch::ScalarType dtype) {
  const fs::path dir(dir_text);
  RETURN_IF_ERROR(VerifyManifest(dir));
  ASSIGN_OR_RETURN(const json j, ReadJson(dir / kState));
  if (!j.contains("layout") || !j.contains("model_config") || !j.contains("world_size")) {
    return absl::DataLossError(absl::StrCat((dir / kState).string(), ": malformed"));
  }
  ASSIGN_OR_RETURN(model::Qwen2VLConfig config,
                   model::ParseQwen2VLConfig(j["model_config"].dump(), (dir / kState).string()));
  ASSIGN_OR_RETURN(SavedShards saved, SavedShards::Open(dir, j["world_size"].get<int>()));
  std::vector<model::NamedTensor> tensors;
  for (const json& unit : j["layout"]) {
    const std::string name = unit["unit"].get<std::string>();
    ASSIGN_OR_RETURN(torch::Tensor flat,
                     saved.Read(name, "master", 0, unit["numel"].get<int64_t>()));
    int64_t offset = 0;
    for (const json& param : unit["params"]) {
      const std::vector<int64_t> shape = param[1].get<std::vector<int64_t>>();
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      tensors.push_back(
          {param[0].get<std::string>(), flat.narrow(0, offset, numel).view(shape).to(dtype)});
      offset += numel;
    }
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec)
    return absl::UnavailableError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  model::SaveOptions save;
  save.dtype = dtype;
  RETURN_IF_ERROR(model::SaveHfTensors(config, std::move(tensors), out_dir, save));
  CopyTokenizerFiles(dir, out_dir);
  return absl::OkStatus();
}

}  // namespace trainctl::trainer
