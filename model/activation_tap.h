// ActivationTap: an optional callback that receives named intermediates of a model forward
// ("block.double.3.img", "hidden_states.9"), used by the golden checker and debugging.
#pragma once

#include <functional>

#include "absl/strings/string_view.h"
#include "kernels/base/tensor.h"

namespace flux2 {

using ActivationTap = std::function<void(absl::string_view name, const Tensor& value)>;

}  // namespace flux2
