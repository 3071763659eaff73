// The teacher of trace distillation behind an OpenAI-compatible server (vLLM, SGLang,
// `trainctl-trainer serve`): each prompt is one POST {base_url}/chat/completions (more when the
// server caps n), with up to `concurrency` requests in flight, a timeout per request, and retries
// with capped, jittered exponential back-off on 429, 5xx, connection errors and timeouts (a
// Retry-After header in seconds is honoured). Other 4xx answers fail at once.
//
// Request: model, messages (text parts; images inlined as data: URLs, the MIME type from the
// file's first bytes), n, temperature, top_p, top_k (only when > 0), max_tokens, seed =
// EndpointRequestSeed(sampling seed, prompt index, round): a server that returns fewer than n
// choices is asked again for the rest (round 1, 2, ...). Answer: each choice's message.content and
// finish_reason; its token count is the length of its token_ids when the server sends them
// (`trainctl-trainer serve` does), else usage.completion_tokens split evenly over the response's
// choices (exact for one choice); prompt_tokens from usage.
//
// No LibTorch here. Builds without cpp-httplib get a MakeEndpointTeacher that returns
// UNIMPLEMENTED (CUDA builds have it from scripts/gpu-deps.sh's prefix).
#ifndef TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_ENDPOINT_TEACHER_H_
#define TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_ENDPOINT_TEACHER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/trainer/stages/internal/teacher.h"

namespace trainctl::trainer::internal {

// The seed of request `round` for prompt `index`: the sampling seed and the index mixed
// (SplitMix64), not added, because servers seed choice k with seed + k (ours does): with seed +
// index, prompt p's choice k and prompt p + 1's choice k - 1 would draw the same numbers. In
// [0, 2^63), as OpenAI's seed is a signed 64-bit integer.
uint64_t EndpointRequestSeed(uint64_t seed, int64_t index, int64_t round);

struct EndpointTeacherOptions {
  // "http://host:port/v1" (or https:// when cpp-httplib was built with OpenSSL); no trailing "/".
  std::string base_url;
  // Empty: the first id listed by GET {base_url}/models, fetched once at construction.
  std::string model;
  std::string api_key;                   // sent as "Authorization: Bearer <api_key>" when not empty
  int concurrency = 8;                   // requests in flight at most
  double timeout_seconds = 600;          // per attempt, whole: connect, send, wait and read
  int max_retries = 5;                   // further attempts after the first one fails retryably
  double backoff_initial_seconds = 1.0;  // the k-th retry waits initial * 2^k, jittered
  double backoff_max_seconds = 60.0;  // cap on one wait (a Retry-After header is capped by it too)
};

// A teacher over the endpoint. INVALID_ARGUMENT for a malformed base_url or option; when `model`
// is empty and GET /models fails or lists no model, an error naming that URL (UNAVAILABLE, or
// the code of the server's 4xx); UNIMPLEMENTED in builds without cpp-httplib.
//
// Complete's errors name the prompt index, and for HTTP the URL, status, the server's
// error.message and the attempts made: UNAVAILABLE (DEADLINE_EXCEEDED when the last attempt timed
// out) once retries are spent; for a 4xx other than 429, at once, INVALID_ARGUMENT (400, 413,
// 422), UNAUTHENTICATED (401), PERMISSION_DENIED (403), NOT_FOUND (404), FAILED_PRECONDITION
// (others); INVALID_ARGUMENT or NOT_FOUND for an image that cannot be read or is none of PNG,
// JPEG, GIF, WebP, BMP; INTERNAL for a malformed answer. The first failure stops the other
// requests. Call Complete from one thread at a time (it runs its own worker threads and joins
// them before returning).
absl::StatusOr<std::unique_ptr<Teacher>> MakeEndpointTeacher(const EndpointTeacherOptions& options);

}  // namespace trainctl::trainer::internal

#endif  // TRAINCTL_WORKER_TRAINER_STAGES_INTERNAL_ENDPOINT_TEACHER_H_
