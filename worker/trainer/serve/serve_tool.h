// `trainctl-trainer serve --model DIR --listen HOST:PORT [--max_batch N] [--batch_window_ms MS]
// [--served_model_name NAME] [--image_root DIR] [--max_tokens N] [--device ..] [--dtype ..]
// [--attention ..]`: loads the HF model directory (its tokenizer.json, generation_config.json's
// eos and pad ids as `generate` reads them) and serves it OpenAI-style (openai_server.h) until
// SIGINT or SIGTERM. Port 0 picks a free port; the first line on stdout is
// "serving NAME on http://HOST:PORT" once it listens.
#ifndef TRAINCTL_WORKER_TRAINER_SERVE_SERVE_TOOL_H_
#define TRAINCTL_WORKER_TRAINER_SERVE_SERVE_TOOL_H_

#include <map>
#include <string>

namespace trainctl::serve {

// The verb: 0 after a signal-initiated shutdown, 2 for bad flags, 1 when the model, tokenizer or
// address cannot be had (the reason on stderr).
int RunServe(const std::map<std::string, std::string>& flags);

}  // namespace trainctl::serve

#endif  // TRAINCTL_WORKER_TRAINER_SERVE_SERVE_TOOL_H_
