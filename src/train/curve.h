// Internal: the SVG loss curve of a training run (train + validation loss vs tokens).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fathom::train {

struct CurvePoint {
  int64_t tokens = 0;
  double loss = 0;       // train loss of the step
  double val_loss = -1;  // < 0: no evaluation at this step
};

std::string loss_curve_svg(const std::vector<CurvePoint>& points, const std::string& title);

}  // namespace fathom::train
