// The single-process reference run (trainer_impl.h): no pipeline, no MPI, the same stage modules.
#include "base/check.h"
#include "pipeline/executor_impl.h"
#include "pipeline/trainer_impl.h"

namespace fathom::pipeline {

template <typename T>
ReferenceRun<T> run_reference(const TrainOptions& o, int n_stages) {
  std::vector<std::unique_ptr<StageModule<T>>> stages;
  std::vector<AdamW<T>> adamw;
  for (int s = 0; s < n_stages; ++s) {
    stages.push_back(make_mlp_stage<T>(o.model, s));
    const Status reserved = stages.back()->reserve(1);
    CHECK_MSG(reserved.ok(), "{}", reserved.to_string());
    adamw.emplace_back(stages.back()->parameters().size());
  }
  auto data = make_synthetic_data<T>(o.model);
  const size_t elems = size_t(stages[0]->input_elems());
  std::vector<T> act(elems), grad(elems), next(elems);
  ReferenceRun<T> run;
  for (int step = 0; step < o.steps; ++step) {
    for (auto& s : stages) std::fill(s->gradients().begin(), s->gradients().end(), T(0));
    std::vector<double> losses;
    for (int mb = 0; mb < o.microbatches; ++mb) {
      data->input(step, mb, act.data());
      for (auto& s : stages) {
        s->forward(0, act.data(), next.data());
        std::swap(act, next);
      }
      losses.push_back(data->loss(step, mb, act.data(), grad.data()));
      for (int s = n_stages - 1; s >= 0; --s) {
        stages[size_t(s)]->backward_input(0, grad.data(), s == 0 ? nullptr : next.data());
        stages[size_t(s)]->backward_weight(0);
        std::swap(grad, next);
      }
    }
    run.losses.push_back(std::move(losses));
    if (step == 0) {
      for (auto& s : stages) run.first_grads.emplace_back(s->gradients().begin(), s->gradients().end());
    }
    for (size_t s = 0; s < stages.size(); ++s) {
      adamw[s].step(o.adamw, stages[s]->parameters(), stages[s]->gradients());
      stages[s]->after_optimizer_step();
    }
  }
  for (auto& s : stages) run.final_params.emplace_back(s->parameters().begin(), s->parameters().end());
  return run;
}

template ReferenceRun<float> run_reference<float>(const TrainOptions&, int);
template ReferenceRun<double> run_reference<double>(const TrainOptions&, int);

}  // namespace fathom::pipeline
