// `flux2 bench`: placeholder until it lands; reports that it is not implemented.
#include <cstdio>

#include "server/cli/commands.h"

namespace flux2 {

int run_bench(int argc, char** argv, int first) {
  std::fprintf(stderr, "flux2 bench: not implemented yet\n");
  return 2;
}

}  // namespace flux2
