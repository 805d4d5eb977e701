// SPDX-License-Identifier: GPL-2.0
/*
 * /init of the real-VMX perf-tool initramfs (built by ../perf-initramfs.sh). Runs Debian's
 * `perf record -e instructions:pp` on /bin/vpmu-workload, then `perf report --stdio`, checks
 * that the workload's hot function leads the report, prints PASS/FAIL lines and the closing
 * `N passed, M failed` line, and writes the verdict to the vmm exit port (0xf4), falling back
 * to a power-off. Static, so it needs nothing else in the image.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/io.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define EXIT_PORT 0xf4
#define REPORT "/tmp/report.txt"

static int passed, failed;

static void check(int ok, const char *fmt, ...)
{
	va_list ap;

	printf(ok ? "PASS " : "FAIL ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	if (ok)
		passed++;
	else
		failed++;
}

/* Runs argv with stdout sent to out_path (or the console); returns the exit status. */
static int run(char *const argv[], const char *out_path)
{
	int status;
	pid_t pid = fork();

	if (pid < 0)
		return -1;
	if (pid == 0) {
		if (out_path) {
			int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

			if (fd < 0 || dup2(fd, 1) < 0)
				_exit(126);
		}
		execv(argv[0], argv);
		_exit(127);
	}
	if (waitpid(pid, &status, 0) < 0)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The first sample line of `perf report --stdio` (after the '#' header) names the top symbol. */
static int hot_symbol_leads(const char *path, const char *sym)
{
	char line[512];
	FILE *f = fopen(path, "r");
	int found = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		if (line[0] == '#' || line[0] == '\n')
			continue;
		found = strstr(line, sym) != NULL;
		break;
	}
	fclose(f);
	return found;
}

int main(void)
{
	char *record[] = { "/usr/bin/perf", "record", "-e", "instructions:pp", "-N",
			   "-o", "/tmp/perf.data", "--", "/bin/vpmu-workload", NULL };
	char *report[] = { "/usr/bin/perf", "report", "--stdio", "-i", "/tmp/perf.data",
			   "--sort", "symbol", NULL };
	int rc;

	mount("proc", "/proc", "proc", 0, NULL);
	mount("sysfs", "/sys", "sysfs", 0, NULL);
	mount("devtmpfs", "/dev", "devtmpfs", 0, NULL);
	mount("tmpfs", "/tmp", "tmpfs", 0, NULL);
	setenv("HOME", "/tmp", 1);
	setenv("PATH", "/usr/bin:/bin", 1);

	rc = run(record, NULL);
	check(rc == 0, "perf_record: exit status %d", rc);
	rc = run(report, REPORT);
	check(rc == 0, "perf_report: exit status %d", rc);
	if (rc == 0) {
		char *cat[] = { "/usr/bin/perf", "report", "--stdio", "-i", "/tmp/perf.data",
				"--sort", "symbol", "--percent-limit", "1", NULL };

		run(cat, NULL);
	}
	check(hot_symbol_leads(REPORT, "vpmu_hot_loop"),
	      "perf_report_hot_symbol: vpmu_hot_loop is the top symbol");
	printf("%d passed, %d failed\n", passed, failed);
	fflush(stdout);

	if (ioperm(EXIT_PORT, 4, 1) == 0)
		outl(failed ? 1 : 0, EXIT_PORT);
	sync();
	reboot(RB_POWER_OFF);
	return 0;
}
