// `flux2 generate`: placeholder until it lands; reports that it is not implemented.
#include <cstdio>

#include "server/cli/commands.h"

namespace flux2 {

int run_generate(int argc, char** argv, int first) {
  std::fprintf(stderr, "flux2 generate: not implemented yet\n");
  return 2;
}

}  // namespace flux2
