// A hand-made byte-level BPE tokenizer.json for unit tests: the 256 byte symbols (id = byte
// value), a few merges, Qwen's NFC normalizer and split regex, and added tokens exercising every
// flag. Tests edit the JSON to make broken files.
#ifndef TRAINCTL_TESTS_TOKENIZER_TINY_TOKENIZER_H_
#define TRAINCTL_TESTS_TOKENIZER_TINY_TOKENIZER_H_

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/tokenizer/internal/byte_level.h"

namespace trainctl::tokenizer::testing {

inline constexpr char kQwenSplitRegex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Ids of the added tokens.
inline constexpr int kImStart = 1000, kImEnd = 1001, kVisionStart = 1002, kImagePad = 1003,
                     kVisionEnd = 1004, kThink = 1005, kA = 1006, kAB = 1007, kMask = 1008,
                     kSingleWord = 1009, kCafe = 1010;

// The byte-level symbol string of raw `bytes` ("hello world" -> "helloĠworld").
inline std::string Symbols(const std::string& bytes) {
  std::string out;
  for (const char b : bytes) out += internal::ByteSymbols()[static_cast<unsigned char>(b)];
  return out;
}

// Merges in rank order, as raw byte strings (converted to symbols when written out).
inline std::vector<std::pair<std::string, std::string>> TinyMerges() {
  return {{"h", "e"},   {"l", "l"},   {"he", "ll"},     {"hell", "o"},       {" ", "w"}, {"o", "r"},
          {" w", "or"}, {"l", "d"},   {" wor", "ld"},   {"b", "c"},          {"a", "b"}, {"a", "a"},
          {" ", " "},   {"\n", "\n"}, {"\xED", "\x95"}, {"\xED\x95", "\x9C"}};
}

inline nlohmann::json AddedToken(int id, const std::string& content, bool special,
                                 nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json t = {{"id", id},          {"content", content}, {"single_word", false},
                      {"lstrip", false},   {"rstrip", false},    {"normalized", false},
                      {"special", special}};
  t.update(extra);
  return t;
}

inline nlohmann::json TinyTokenizerJson() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[internal::ByteSymbols()[b]] = b;
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [left, right] : TinyMerges()) {
    merges.push_back({Symbols(left), Symbols(right)});
    const std::string merged = Symbols(left + right);
    if (!vocab.contains(merged)) vocab[merged] = static_cast<int>(vocab.size());
  }
  nlohmann::json added = {
      AddedToken(kImStart, "<|im_start|>", true),
      AddedToken(kImEnd, "<|im_end|>", true),
      AddedToken(kVisionStart, "<|vision_start|>", true),
      AddedToken(kImagePad, "<|image_pad|>", true),
      AddedToken(kVisionEnd, "<|vision_end|>", true),
      AddedToken(kThink, "<think>", false),
      AddedToken(kA, "<a>", false),
      AddedToken(kAB, "<a><b>", false),
      AddedToken(kMask, "<mask>", true, {{"lstrip", true}, {"rstrip", true}}),
      AddedToken(kSingleWord, "[W]", true, {{"single_word", true}}),
      AddedToken(kCafe, "caf\u00e9", false, {{"normalized", true}}),
  };
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", kQwenSplitRegex}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", false},
           {"use_regex", false}}}}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}},
  };
}

}  // namespace trainctl::tokenizer::testing

#endif  // TRAINCTL_TESTS_TOKENIZER_TINY_TOKENIZER_H_
