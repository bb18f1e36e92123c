// `fathom-sandbox`: the sandbox launcher as a small executable of its own. Plugins and shell
// commands start through it; the full `fathom` binary (MPI, RocksDB and thirty other shared
// libraries) would cost its dynamic loading on every sandboxed start. Same arguments as
// `fathom agent sandbox` (see sandbox.h); sandbox_wrap() prefers this binary when it sits next to
// the running executable.
#include "agent/sandbox.h"

int main(int argc, char** argv) {
  return fathom::agent::sandbox_main(argc, argv);
}
