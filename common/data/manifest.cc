#include "common/data/manifest.h"

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainctl::data {
namespace {

using json = nlohmann::json;

absl::Status Bad(absl::string_view source, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": '", field, "' ", what));
}

absl::Status ReadCount(const json& object, const char* field, absl::string_view source,
                       int64_t* out) {
  if (!object.contains(field) || !object[field].is_number_integer() ||
      object[field].get<int64_t>() < 0) {
    return Bad(source, field, "must be a non-negative integer");
  }
  *out = object[field].get<int64_t>();
  return absl::OkStatus();
}

// A field read without trusting its type (json::value throws when the key holds another type):
// the string, or "" when absent or not a string.
std::string StringField(const json& object, const char* field) {
  auto it = object.find(field);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

int64_t IntegerField(const json& object, const char* field) {
  auto it = object.find(field);
  return it != object.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

// The manifest's identity: a JSON object of this format, version and checksum.
absl::Status CheckManifestFormat(const json& j, absl::string_view source) {
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  if (StringField(j, "format") != kShardFormat) {
    return Bad(source, "format", absl::StrCat("must be \"", kShardFormat, "\""));
  }
  if (!j.contains("version") || !j["version"].is_number_integer() ||
      j["version"].get<int>() != kShardFormatVersion) {
    return Bad(source, "version", absl::StrCat("must be ", kShardFormatVersion));
  }
  if (StringField(j, "checksum") != "crc32c") return Bad(source, "checksum", "must be \"crc32c\"");
  return absl::OkStatus();
}

// The dataset-wide fields: patch_dtype, pad_token_id and the counts, all required.
absl::Status ReadManifestTotals(const json& j, absl::string_view source, DatasetManifest* m) {
  const std::string dtype = StringField(j, "patch_dtype");
  if (dtype == "float32") {
    m->patch_dtype = PatchDtype::kFloat32;
  } else if (dtype == "bfloat16") {
    m->patch_dtype = PatchDtype::kBfloat16;
  } else {
    return Bad(source, "patch_dtype", "must be \"float32\" or \"bfloat16\"");
  }
  if (!j.contains("pad_token_id") || !j["pad_token_id"].is_number_integer()) {
    return Bad(source, "pad_token_id", "must be an integer");
  }
  m->pad_token_id = j["pad_token_id"].get<int32_t>();
  for (auto [field, out] : {std::pair<const char*, int64_t*>{"num_samples", &m->num_samples},
                            {"num_tokens", &m->num_tokens},
                            {"num_label_tokens", &m->num_label_tokens},
                            {"num_images", &m->num_images},
                            {"num_patches", &m->num_patches}}) {
    if (absl::Status s = ReadCount(j, field, source, out); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// How the dataset was prepared (the "prepared" object): informational, so fields that are missing
// or of another type are left at their defaults.
void ReadManifestPrepared(const json& p, DatasetManifest* m) {
  if (p.contains("inputs") && p["inputs"].is_array()) {
    for (const json& input : p["inputs"]) {
      if (input.is_string()) m->inputs.push_back(input.get<std::string>());
    }
  }
  m->tokenizer = StringField(p, "tokenizer");
  m->overflow = StringField(p, "overflow");
  for (auto [field, out] : {std::pair<const char*, int64_t*>{"min_pixels", &m->min_pixels},
                            {"max_pixels", &m->max_pixels},
                            {"max_seq_len", &m->max_seq_len},
                            {"records", &m->records},
                            {"skipped", &m->skipped},
                            {"truncated", &m->truncated},
                            {"dropped", &m->dropped}}) {
    if (p.contains(field) && p[field].is_number_integer()) *out = p[field].get<int64_t>();
  }
  if (p.contains("skipped_records") && p["skipped_records"].is_array()) {
    for (const json& s : p["skipped_records"]) {
      if (!s.is_object()) continue;
      m->skipped_records.push_back(
          {StringField(s, "file"), IntegerField(s, "line"), StringField(s, "error")});
    }
  }
}

// One entry of "shards" (`where`: "shards[<i>]", for errors).
absl::StatusOr<ShardInfo> ReadManifestShard(const json& s, const std::string& where,
                                            absl::string_view source) {
  if (!s.is_object() || !s.contains("file") || !s["file"].is_string()) {
    return Bad(source, where, "needs a 'file'");
  }
  ShardInfo info;
  info.file = s["file"].get<std::string>();
  if (info.file.empty() || info.file.find('/') != std::string::npos || info.file[0] == '.') {
    return Bad(source, where + ".file", "must be a plain file name");
  }
  if (absl::Status st = ReadCount(s, "num_samples", source, &info.num_samples); !st.ok()) {
    return st;
  }
  if (absl::Status st = ReadCount(s, "bytes", source, &info.bytes); !st.ok()) return st;
  const std::string crc = StringField(s, "crc32c");
  uint32_t value = 0;
  if (crc.size() != 8 || !absl::SimpleHexAtoi(crc, &value)) {
    return Bad(source, where + ".crc32c", "must be 8 hex digits");
  }
  info.crc32c = value;
  return info;
}

// The "shards" list, whose samples must add up to num_samples.
absl::Status ReadManifestShards(const json& j, absl::string_view source, DatasetManifest* m) {
  if (!j.contains("shards") || !j["shards"].is_array()) {
    return Bad(source, "shards", "must be a list");
  }
  int64_t total = 0;
  for (size_t i = 0; i < j["shards"].size(); ++i) {
    absl::StatusOr<ShardInfo> info =
        ReadManifestShard(j["shards"][i], absl::StrCat("shards[", i, "]"), source);
    if (!info.ok()) return info.status();
    total += info->num_samples;
    m->shards.push_back(*std::move(info));
  }
  if (total != m->num_samples) {
    return Bad(source, "num_samples",
               absl::StrCat("is ", m->num_samples, " but the shards hold ", total));
  }
  return absl::OkStatus();
}

}  // namespace

const char* PatchDtypeName(PatchDtype dtype) {
  return dtype == PatchDtype::kBfloat16 ? "bfloat16" : "float32";
}

std::string ManifestToJson(const DatasetManifest& m) {
  json skipped_records = json::array();
  for (const SkippedRecord& s : m.skipped_records) {
    skipped_records.push_back({{"file", s.file}, {"line", s.line}, {"error", s.error}});
  }
  json shards = json::array();
  for (const ShardInfo& s : m.shards) {
    shards.push_back({{"file", s.file},
                      {"num_samples", s.num_samples},
                      {"bytes", s.bytes},
                      {"crc32c", absl::StrFormat("%08x", s.crc32c)}});
  }
  const json out = {
      {"format", kShardFormat},
      {"version", kShardFormatVersion},
      {"checksum", "crc32c"},
      {"patch_dtype", PatchDtypeName(m.patch_dtype)},
      {"patch_dim", 1176},
      {"pad_token_id", m.pad_token_id},
      {"num_samples", m.num_samples},
      {"num_tokens", m.num_tokens},
      {"num_label_tokens", m.num_label_tokens},
      {"num_images", m.num_images},
      {"num_patches", m.num_patches},
      {"prepared",
       {{"inputs", m.inputs},
        {"tokenizer", m.tokenizer},
        {"min_pixels", m.min_pixels},
        {"max_pixels", m.max_pixels},
        {"max_seq_len", m.max_seq_len},
        {"overflow", m.overflow},
        {"records", m.records},
        {"skipped", m.skipped},
        {"truncated", m.truncated},
        {"dropped", m.dropped},
        {"skipped_records", skipped_records}}},
      {"shards", shards},
  };
  return out.dump(2) + "\n";
}

absl::StatusOr<DatasetManifest> ParseManifest(absl::string_view text, absl::string_view source) {
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (absl::Status s = CheckManifestFormat(j, source); !s.ok()) return s;
  DatasetManifest m;
  if (absl::Status s = ReadManifestTotals(j, source, &m); !s.ok()) return s;
  if (j.contains("prepared") && j["prepared"].is_object()) ReadManifestPrepared(j["prepared"], &m);
  if (absl::Status s = ReadManifestShards(j, source, &m); !s.ok()) return s;
  return m;
}

}  // namespace trainctl::data
