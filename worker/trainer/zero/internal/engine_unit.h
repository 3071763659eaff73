// The engine's unit: one group of the model's parameters as one flat buffer, partitioned over
// the ranks (see engine.h). Shared by the engine's translation units only.
#ifndef TRAINCTL_WORKER_TRAINER_ZERO_INTERNAL_ENGINE_UNIT_H_
#define TRAINCTL_WORKER_TRAINER_ZERO_INTERNAL_ENGINE_UNIT_H_

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "worker/trainer/zero/comm.h"
#include "worker/trainer/zero/engine.h"

namespace trainctl::zero {

struct Engine::Unit {
  struct Slot {
    std::string name;
    torch::Tensor param;  // the model's parameter; its data is bound to a view of `full`
    std::vector<int64_t> shape;
    int64_t offset = 0;
    int64_t numel = 0;
    bool decay = true;
  };
  std::string name;
  std::vector<Slot> slots;
  int64_t numel = 0;                                      // F, unpadded
  int64_t shard = 0;                                      // S: elements per rank (stage 0: F)
  int64_t begin = 0;                                      // this rank's first element
  int64_t padded = 0;                                     // S * W (stage 0: F)
  std::vector<std::pair<int64_t, int64_t>> decay_ranges;  // local [begin, end) in master
  // Tensor parallelism: local [begin, end) in master of weights sliced over the group, and of
  // the replicated ones (padding in neither).
  std::vector<std::pair<int64_t, int64_t>> sliced_ranges, replicated_ranges;

  torch::Tensor master;        // fp32 [S] (frozen: compute dtype); stage 3: the autograd leaf
  size_t optimizer_slice = 0;  // its index in the optimizer
  torch::Tensor grad32;        // stages 1-2: fp32 [S]
  torch::Tensor full;          // working weights [padded], compute dtype; undefined when freed
  torch::Tensor full_grad;     // stages 0-2: [padded]; the parameters' .grad are views of it
  Handle gather;
  bool gathering = false;  // an all-gather into `full` is in flight
  bool resident = false;   // stage 3: `full` holds bytes (gathered or being gathered)
  int refs = 0;
  bool persistent = false;
  std::vector<Unit*> borrowed;               // stage 3: units whose weights this one reads
  std::vector<std::string> borrowed_params;  // their parameter names

  int64_t local() const { return std::max<int64_t>(0, std::min(shard, numel - begin)); }
};

// Stage 3: runs each unit through the engine (engine_stage3.cc).
class Engine::Runner : public model::UnitRunner {
 public:
  explicit Runner(Engine* engine) : engine_(engine) {}
  torch::Tensor RunUnit(const model::ModelUnit& unit, const UnitFn& fn, const torch::Tensor& input,
                        bool checkpoint) override;

 private:
  class Function;
  Engine* engine_;
};

}  // namespace trainctl::zero

#endif  // TRAINCTL_WORKER_TRAINER_ZERO_INTERNAL_ENGINE_UNIT_H_
