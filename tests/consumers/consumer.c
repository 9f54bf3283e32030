/* A C program that finds graphsafe as an installed package: built by .ci/run once with
 * `pkg-config --cflags --libs graphsafe` and once through find_package(graphsafe) (cmake/). It
 * plans an MLA decode (host-only: no GPU needed) and prints the library's version. */
#include <graphsafe.h>
#include <stdio.h>

int main(void) {
  GraphsafeMlaPlan plan;
  int st = graphsafe_mla_plan(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, 128, 1, 65536, 64, 132, 0, &plan);
  if (st != GRAPHSAFE_OK) {
    fprintf(stderr, "graphsafe_mla_plan failed (%d): %s\n", st, graphsafe_last_error());
    return 1;
  }
  printf("graphsafe %s (%s): batch 1 x 65536 on sm_90 -> %d splits, %llu workspace bytes\n", graphsafe_version(),
         graphsafe_build_archs(), plan.num_splits, (unsigned long long)plan.workspace_bytes);
  return plan.num_splits > 0 ? 0 : 1;
}
