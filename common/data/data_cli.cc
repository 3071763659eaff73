#include "common/data/data_cli.h"

#include <map>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/data/prepare.h"
#include "common/data/shapes_datagen.h"
#include "common/verb_args.h"

namespace trainctl::data {
namespace {

constexpr char kPrepareUsage[] =
    "usage: trainctl prepare --input FILE.jsonl [--input ...] --out DIR --tokenizer DIR_OR_JSON "
    "[--image_root DIR] [--skip_bad] [--max_seq_len N] [--truncate] [--min_pixels N] "
    "[--max_pixels N] [--shard_size_mb N] [--bf16_patches] [--overwrite] [--threads N]";
constexpr char kDatagenUsage[] = "usage: trainctl datagen shapes --out DIR --n N [--seed S]";

// The options after the verb, each as `--name value` or `--name=value` (common/verb_args.h); no
// positional arguments.
absl::StatusOr<ParsedArgs> ParseFlags(const std::vector<std::string>& args,
                                      const std::vector<OptionSpec>& specs) {
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(args, specs, /*allow_passthrough=*/false);
  if (!parsed.ok()) return parsed.status();
  if (!parsed->positional.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", parsed->positional.front(), "'"));
  }
  return parsed;
}

// The one value of --name: INVALID_ARGUMENT when it is given twice, or absent and `required`.
absl::StatusOr<std::string> One(const ParsedArgs& flags, const std::string& name, bool required) {
  const std::vector<std::string>& values = flags.GetAll(name);
  if (values.empty()) {
    if (required) return absl::InvalidArgumentError(absl::StrCat("--", name, " is required"));
    return std::string();
  }
  if (values.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " given more than once"));
  }
  return values.front();
}

// Sets `*out` from --name when present; it must be an integer >= `min`.
absl::Status Integer(const ParsedArgs& flags, const std::string& name, int64_t min, int64_t* out) {
  auto text = One(flags, name, false);
  if (!text.ok()) return text.status();
  if (!flags.Has(name)) return absl::OkStatus();
  int64_t value = 0;
  if (!absl::SimpleAtoi(*text, &value) || value < min) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be an integer >= ", min, ", got '", *text, "'"));
  }
  *out = value;
  return absl::OkStatus();
}

bool WantsHelp(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

absl::StatusOr<PrepareOptions> PrepareOptionsFrom(const std::vector<std::string>& args) {
  auto flags = ParseFlags(args, {{"input", "", true},
                                 {"out", "", true},
                                 {"tokenizer", "", true},
                                 {"image_root", "", true},
                                 {"skip_bad", "", false},
                                 {"max_seq_len", "", true},
                                 {"truncate", "", false},
                                 {"min_pixels", "", true},
                                 {"max_pixels", "", true},
                                 {"shard_size_mb", "", true},
                                 {"bf16_patches", "", false},
                                 {"overwrite", "", false},
                                 {"threads", "", true}});
  if (!flags.ok()) return flags.status();
  PrepareOptions o;
  if (!flags->Has("input")) return absl::InvalidArgumentError("--input is required");
  o.inputs = flags->GetAll("input");
  for (auto [name, field] : {std::pair<const char*, std::string*>{"out", &o.out_dir},
                             {"tokenizer", &o.tokenizer_path}}) {
    auto value = One(*flags, name, true);
    if (!value.ok()) return value.status();
    *field = *value;
  }
  auto root = One(*flags, "image_root", false);
  if (!root.ok()) return root.status();
  o.image_root = *root;
  o.skip_bad = flags->Has("skip_bad");
  o.overflow = flags->Has("truncate") ? Overflow::kTruncate : Overflow::kDrop;
  o.patch_dtype = flags->Has("bf16_patches") ? PatchDtype::kBfloat16 : PatchDtype::kFloat32;
  o.overwrite = flags->Has("overwrite");
  int64_t shard_mb = o.shard_size_bytes >> 20, threads = 0;
  for (auto [name, min, field] :
       {std::tuple<const char*, int64_t, int64_t*>{"max_seq_len", 1, &o.max_seq_len},
        {"min_pixels", 1, &o.image.min_pixels},
        {"max_pixels", 1, &o.image.max_pixels},
        {"shard_size_mb", 1, &shard_mb},
        {"threads", 1, &threads}}) {
    if (absl::Status s = Integer(*flags, name, min, field); !s.ok()) return s;
  }
  if (flags->Has("truncate") && o.max_seq_len == 0) {
    return absl::InvalidArgumentError("--truncate needs --max_seq_len");
  }
  if (o.image.max_pixels < o.image.min_pixels) {
    return absl::InvalidArgumentError("--max_pixels must be at least --min_pixels");
  }
  if (shard_mb > (int64_t{1} << 30)) return absl::InvalidArgumentError("--shard_size_mb too large");
  o.shard_size_bytes = shard_mb << 20;
  o.num_threads = static_cast<int32_t>(std::min<int64_t>(threads, 1024));
  return o;
}

}  // namespace

const char* DataVerbsUsage() {
  return "  prepare --input FILE.jsonl --out DIR --tokenizer DIR   JSONL (open-r1, VLM-R1, "
         "messages)"
         " -> shards\n"
         "          [--image_root DIR] [--skip_bad] [--max_seq_len N [--truncate]]\n"
         "          [--min_pixels N] [--max_pixels N] [--shard_size_mb N] [--bf16_patches]\n"
         "          [--overwrite] [--threads N]\n"
         "  datagen shapes --out DIR --n N [--seed S]   synthetic shapes VQA set (open-r1 JSONL)\n";
}

int RunPrepareVerb(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (WantsHelp(args)) {
    out << kPrepareUsage << "\n";
    return 0;
  }
  auto options = PrepareOptionsFrom(args);
  if (!options.ok()) {
    err << "trainctl prepare: " << options.status().message() << " (" << kPrepareUsage << ")\n";
    return 2;
  }
  auto manifest = PrepareDataset(*options);
  if (!manifest.ok()) {
    err << "trainctl prepare: " << manifest.status().message() << "\n";
    return 1;
  }
  for (const SkippedRecord& s : manifest->skipped_records) {
    err << "trainctl prepare: skipped " << s.file << ":" << s.line << ": " << s.error << "\n";
  }
  out << "prepared " << manifest->num_samples << " samples (" << manifest->num_tokens << " tokens, "
      << manifest->num_label_tokens << " trained on, " << manifest->num_images << " images) in "
      << manifest->shards.size() << " shard(s) at " << options->out_dir << " from "
      << manifest->records << " records; skipped " << manifest->skipped << ", truncated "
      << manifest->truncated << ", dropped " << manifest->dropped << "\n";
  return 0;
}

int RunDatagenVerb(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (WantsHelp(args)) {
    out << kDatagenUsage << "\n";
    return 0;
  }
  auto usage = [&err](absl::string_view message) {
    err << "trainctl datagen: " << message << " (" << kDatagenUsage << ")\n";
    return 2;
  };
  if (args.empty()) return usage("which generator? (shapes)");
  if (args[0] != "shapes") return usage(absl::StrCat("unknown generator '", args[0], "'"));
  auto flags = ParseFlags({args.begin() + 1, args.end()},
                          {{"out", "", true}, {"n", "", true}, {"seed", "", true}});
  if (!flags.ok()) return usage(flags.status().message());
  auto dir = One(*flags, "out", true);
  if (!dir.ok()) return usage(dir.status().message());
  if (!flags->Has("n")) return usage("--n is required");
  int64_t n = 0, seed = 0;
  if (absl::Status s = Integer(*flags, "n", 1, &n); !s.ok()) return usage(s.message());
  if (absl::Status s = Integer(*flags, "seed", 0, &seed); !s.ok()) return usage(s.message());
  if (absl::Status s = GenerateShapes(*dir, n, static_cast<uint64_t>(seed)); !s.ok()) {
    err << "trainctl datagen: " << s.message() << "\n";
    return 1;
  }
  out << "wrote " << n << " shapes items to " << *dir << "/" << kShapesJsonl
      << " (reasoning traces of the same items: " << kShapesReasoningJsonl << ")\n";
  return 0;
}

}  // namespace trainctl::data
