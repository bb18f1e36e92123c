// Trainer internals: the single-process reference run the pipeline is checked against.
#pragma once

#include <vector>

#include "pipeline/trainer.h"

namespace fathom::pipeline {

template <typename T>
struct ReferenceRun {
  std::vector<std::vector<double>> losses;   // [step][mb]
  std::vector<std::vector<T>> first_grads;   // [stage] after step 0
  std::vector<std::vector<T>> final_params;  // [stage] after the last step
};

// The same model, data and optimizer in one process: every micro-batch forward through all
// stages, then backward (input then weight gradients per stage), in micro-batch order.
template <typename T>
ReferenceRun<T> run_reference(const TrainOptions& options, int n_stages);

}  // namespace fathom::pipeline
