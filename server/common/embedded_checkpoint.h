// Where the embedded tiny FLUX.2-klein checkpoint (random weights, served when no --model-dir is
// given) lives: beside the installed binary (<prefix>/bin/../share/flux2/tiny-klein/checkpoint,
// what `cmake --install` lays out) when that exists, else the directory the build named
// (FLUX2_TINY_CHECKPOINT_DIR: the source tree, or the container's /opt/flux2/share/tiny-klein).
// Tested by tests/host/small_units_test.cc (an installed copy is found from the binary's path).
#pragma once

#include <string>

namespace flux2 {

// The installed location relative to an executable at `exe_path` (absolute).
std::string installed_checkpoint_dir(const std::string& exe_path);

// installed_checkpoint_dir(/proc/self/exe) when it is a directory, else FLUX2_TINY_CHECKPOINT_DIR.
std::string embedded_checkpoint_dir();

}  // namespace flux2
