#include "worker/trainer/serve/chat_request.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "worker/trainer/serve/request_budget.h"

namespace trainctl::serve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tokenizer::ChatPart;

// Adds `param` to an INVALID_ARGUMENT that has none.
absl::Status WithParam(absl::Status status, const std::string& param) {
  if (status.code() != absl::StatusCode::kInvalidArgument || !ErrorParam(status).empty()) {
    return status;
  }
  return InvalidParam(param, status.message());
}

// Why a body that nlohmann could not parse is refused: a number out of range names its field
// (the last key read before it, as "max_tokens" for `"max_tokens": 1e400`), else the syntax error.
absl::Status NotJson(absl::string_view body) {
  std::string key;
  const json::parser_callback_t track = [&key](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && parsed.is_string()) key = parsed.get<std::string>();
    return true;
  };
  try {
    const json parsed = json::parse(body, track);
    static_cast<void>(parsed);
  } catch (const json::out_of_range&) {
    return InvalidParam(key, "the number is out of range (not a finite double)");
  } catch (const json::exception& e) {
    std::string why = e.what();
    const size_t at = why.find("] ");  // past "[json.exception.parse_error.101] "
    if (at != std::string::npos) why = why.substr(at + 2);
    return InvalidParam("", absl::StrCat("the body is not valid JSON: ", why));
  }
  return InvalidParam("", "the body is not a JSON object");
}

absl::StatusOr<std::string> Text(const json& value, const std::string& param) {
  if (!value.is_string()) return InvalidParam(param, "expected a string");
  std::string text = value.get<std::string>();
  if (!IsValidUtf8(text)) return InvalidParam(param, "not valid UTF-8");
  return text;
}

absl::Status ParseContent(const json& content, const std::string& param, ChatRequest& out,
                          tokenizer::ChatMessage& message) {
  if (content.is_null() && message.role == "assistant") return absl::OkStatus();
  if (content.is_string()) {
    absl::StatusOr<std::string> text = Text(content, param);
    if (!text.ok()) return text.status();
    message.content.push_back(ChatPart::Text(*std::move(text)));
    return absl::OkStatus();
  }
  if (!content.is_array()) return InvalidParam(param, "expected a string or an array of parts");
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string part_param = absl::StrCat(param, "[", j, "]");
    const json& part = content[j];
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return InvalidParam(part_param, "expected an object with a string \"type\"");
    }
    const std::string type = part["type"].get<std::string>();
    if (type == "text") {
      if (!part.contains("text")) return InvalidParam(part_param + ".text", "required");
      absl::StatusOr<std::string> text = Text(part["text"], part_param + ".text");
      if (!text.ok()) return text.status();
      message.content.push_back(ChatPart::Text(*std::move(text)));
    } else if (type == "image_url") {
      const json* url = part.contains("image_url") ? &part["image_url"] : nullptr;
      if (url != nullptr && url->is_object()) url = url->contains("url") ? &(*url)["url"] : nullptr;
      if (url == nullptr || !url->is_string()) {
        return InvalidParam(part_param + ".image_url", "expected {\"url\": \"data:...\"}");
      }
      out.image_urls.push_back(url->get<std::string>());
      out.image_params.push_back(part_param);
      message.content.push_back(ChatPart::Image(0));
    } else {
      return InvalidParam(part_param + ".type", absl::StrCat("unsupported part type '", type,
                                                             "' (text and image_url are)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseMessages(const json& messages, ChatRequest& out) {
  if (!messages.is_array() || messages.empty()) {
    return InvalidParam("messages", "expected a non-empty array");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string param = absl::StrCat("messages[", i, "]");
    const json& m = messages[i];
    if (!m.is_object()) return InvalidParam(param, "expected an object");
    if (!m.contains("role") || !m["role"].is_string()) {
      return InvalidParam(param + ".role", "required");
    }
    tokenizer::ChatMessage message;
    message.role = m["role"].get<std::string>();
    if (message.role == "developer") message.role = "system";  // OpenAI's newer name for it
    if (message.role != "system" && message.role != "user" && message.role != "assistant") {
      return InvalidParam(param + ".role", absl::StrCat("unsupported role '", m["role"].dump(),
                                                        "' (system, developer, user, assistant)"));
    }
    if (!m.contains("content")) return InvalidParam(param + ".content", "required");
    if (absl::Status s = ParseContent(m["content"], param + ".content", out, message); !s.ok()) {
      return s;
    }
    out.messages.push_back(std::move(message));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Number(const json& body, const char* key, double low, double high) {
  const json& v = body[key];
  if (!v.is_number() || !(v.get<double>() >= low && v.get<double>() <= high)) {
    return InvalidParam(key, absl::StrCat("expected a number in [", low, ", ", high, "]"));
  }
  return v.get<double>();
}

absl::StatusOr<int64_t> Integer(const json& body, const char* key, int64_t low, int64_t high) {
  const json& v = body[key];
  if (!v.is_number_integer() || v.get<int64_t>() < low || v.get<int64_t>() > high) {
    return InvalidParam(key, absl::StrCat("expected an integer in [", low, ", ", high, "]"));
  }
  return v.get<int64_t>();
}

bool Present(const json& body, const char* key) {
  return body.contains(key) && !body[key].is_null();
}

absl::Status ParseSampling(const json& body, const RequestLimits& limits, SamplingParams& s) {
  if (Present(body, "n")) {
    absl::StatusOr<int64_t> n = Integer(body, "n", 1, limits.max_n);
    if (!n.ok()) return n.status();
    s.n = *n;
  }
  if (Present(body, "temperature")) {
    absl::StatusOr<double> t = Number(body, "temperature", 0, 2);
    if (!t.ok()) return t.status();
    // Below kGreedyTemperature the logits / temperature overflow float32 (1e-40 made LibTorch
    // fail), and sampling that cold is argmax anyway: greedy.
    s.temperature = *t < kGreedyTemperature ? 0 : *t;
  }
  if (Present(body, "top_p")) {
    absl::StatusOr<double> p = Number(body, "top_p", 0, 1);
    if (!p.ok()) return p.status();
    if (*p <= 0) return InvalidParam("top_p", "must be above 0");
    s.top_p = *p;
  }
  const char* max_key =
      Present(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  s.max_tokens = limits.max_tokens_default;
  if (Present(body, max_key)) {
    absl::StatusOr<int64_t> m = Integer(body, max_key, 1, limits.max_context);
    if (!m.ok()) return m.status();
    s.max_tokens = *m;
  }
  if (Present(body, "seed")) {
    absl::StatusOr<int64_t> seed = Integer(body, "seed", std::numeric_limits<int64_t>::min(),
                                           std::numeric_limits<int64_t>::max());
    if (!seed.ok()) return seed.status();
    s.seed = static_cast<uint64_t>(*seed);
  }
  if (Present(body, "stop")) {
    const json& stop = body["stop"];
    const std::vector<json> items =
        stop.is_array() ? stop.get<std::vector<json>>() : std::vector<json>(1, stop);
    if (static_cast<int64_t>(items.size()) > limits.max_stop_sequences) {
      return InvalidParam("stop",
                          absl::StrCat("at most ", limits.max_stop_sequences, " sequences"));
    }
    for (const json& item : items) {
      absl::StatusOr<std::string> text = Text(item, "stop");
      if (!text.ok()) return text.status();
      if (text->empty()) return InvalidParam("stop", "empty stop sequence");
      s.stop.push_back(*std::move(text));
    }
  }
  return absl::OkStatus();
}

// Options clients send with their defaults; anything else is refused rather than ignored.
absl::Status CheckUnsupported(const json& body) {
  if (Present(body, "stream") && body["stream"] != false) {
    return InvalidParam("stream", "streaming is not supported; send stream: false");
  }
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    if (Present(body, key) && (!body[key].is_number() || body[key].get<double>() != 0)) {
      return InvalidParam(key, "only 0 is supported");
    }
  }
  if (Present(body, "logprobs") && body["logprobs"] != false) {
    return InvalidParam("logprobs", "log-probabilities are not supported");
  }
  for (const char* key : {"tools", "functions", "response_format", "logit_bias"}) {
    if (Present(body, key)) return InvalidParam(key, "not supported by this server");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadUnder(const std::string& root, const std::string& path,
                                      const std::string& param) {
  if (root.empty()) {
    return InvalidParam(param, "file:// image URLs are not enabled on this server (--image_root)");
  }
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(root, ec);
  const fs::path file = fs::weakly_canonical(fs::path(root) / fs::path(path).relative_path(), ec);
  const std::string b = base.string(), f = file.string();
  if (ec || f.size() <= b.size() || f.compare(0, b.size(), b) != 0 || f[b.size()] != '/') {
    return InvalidParam(param, absl::StrCat("'", path, "' is not inside the image root"));
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return InvalidParam(param, absl::StrCat("cannot read '", path, "'"));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// The bytes an image URL names.
absl::StatusOr<std::string> FetchImage(const std::string& url, const RequestLimits& limits,
                                       const std::string& param) {
  if (absl::StartsWith(url, "data:")) {
    const size_t comma = url.find(',');
    if (comma == std::string::npos || !absl::EndsWith(url.substr(0, comma), ";base64")) {
      return InvalidParam(param, "a data: URL must be data:<mime>;base64,<data>");
    }
    std::string bytes;
    if (!absl::Base64Unescape(absl::string_view(url).substr(comma + 1), &bytes)) {
      return InvalidParam(param, "the data: URL's base64 is malformed");
    }
    return bytes;
  }
  if (absl::StartsWith(url, "file://")) return ReadUnder(limits.image_root, url.substr(7), param);
  return InvalidParam(param, "only data: and file:// image URLs are supported");
}

}  // namespace

absl::Status InvalidParam(const std::string& param, absl::string_view message) {
  const bool named = param.empty() || absl::StartsWith(message, absl::StrCat(param, ": "));
  absl::Status status =
      absl::InvalidArgumentError(named ? std::string(message) : absl::StrCat(param, ": ", message));
  if (!param.empty()) status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

std::string ErrorParam(const absl::Status& status) {
  const auto param = status.GetPayload(kParamPayload);
  return param ? std::string(*param) : std::string();
}

absl::StatusOr<ChatRequest> ParseChatRequest(absl::string_view body, const RequestLimits& limits) {
  const json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return NotJson(body);
  if (!doc.is_object()) return InvalidParam("", "the body is not a JSON object");
  ChatRequest out;
  if (Present(doc, "model")) {
    absl::StatusOr<std::string> model = Text(doc["model"], "model");
    if (!model.ok()) return model.status();
    out.model = *model;
  }
  if (!doc.contains("messages")) return InvalidParam("messages", "required");
  if (absl::Status s = ParseMessages(doc["messages"], out); !s.ok()) return s;
  if (static_cast<int64_t>(out.image_urls.size()) > limits.max_images) {
    return InvalidParam("messages", absl::StrCat("at most ", limits.max_images, " images"));
  }
  if (absl::Status s = CheckUnsupported(doc); !s.ok()) return s;
  if (absl::Status s = ParseSampling(doc, limits, out.sampling); !s.ok()) return s;
  return out;
}

absl::StatusOr<ChatPrompt> BuildChatPrompt(const ChatRequest& request,
                                           const tokenizer::BpeTokenizer& tokenizer,
                                           const RequestLimits& limits) {
  // Checks before work: every image's header and the text's length against the context first.
  std::vector<std::string> image_bytes;
  for (size_t k = 0; k < request.image_urls.size(); ++k) {
    absl::StatusOr<std::string> bytes =
        FetchImage(request.image_urls[k], limits, request.image_params[k]);
    if (!bytes.ok()) return bytes.status();
    image_bytes.push_back(*std::move(bytes));
  }
  if (absl::Status s = CheckPromptBudget(request, image_bytes, tokenizer, limits).status();
      !s.ok()) {
    return s;
  }
  std::vector<data::ProcessedImage> images;
  for (size_t k = 0; k < request.image_urls.size(); ++k) {
    const std::string& param = request.image_params[k];
    absl::StatusOr<data::RgbImage> image = data::DecodeImage(image_bytes[k], param);
    std::string().swap(image_bytes[k]);  // the encoded bytes are not needed past here
    if (!image.ok()) return WithParam(image.status(), param);
    absl::StatusOr<data::ProcessedImage> processed = data::PreprocessImage(*image, limits.image);
    if (!processed.ok()) return InvalidParam(param, processed.status().message());
    images.push_back(*std::move(processed));
  }
  absl::StatusOr<ChatPrompt> prompt = data::BuildChatPrompt(request.messages, images, tokenizer);
  if (!prompt.ok()) return WithParam(prompt.status(), "messages");
  if (static_cast<int64_t>(prompt->ids.size()) + request.sampling.max_tokens > limits.max_context) {
    return InvalidParam("messages",
                        absl::StrCat("the prompt's ", prompt->ids.size(), " tokens and ",
                                     request.sampling.max_tokens, " new ones exceed the ",
                                     limits.max_context, "-token context"));
  }
  return prompt;
}

}  // namespace trainctl::serve
