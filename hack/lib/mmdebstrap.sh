# Shared by hack/build-images.sh and kernel/vmtest/build-root.sh (sourced,
# not run).

# tclone_mmdebstrap ARGS...: runs mmdebstrap ARGS.
#
# Bookworm's mmdebstrap (1.3.x) starts by asking apt for its legacy keyring
# and prints the answer with an unquoted `printf $v` through sh. apt 3.0
# (trixie's, which a host that took Podman's stack from trixie may have) no
# longer has a legacy keyring, so the answer is empty and dash prints
# "sh: 1: printf: usage: printf format [arg ...]" in the middle of the
# build; mmdebstrap 1.4 quotes it. When the host's apt has no legacy keyring,
# mmdebstrap is told one that does not exist: it then uses none, which is
# what apt 3.0 means, and has a value to print. The file only feeds that
# first question: mmdebstrap points APT_CONFIG at its own file before it runs
# apt.
tclone_mmdebstrap() {
	if [ -n "$(apt-config shell v Dir::Etc::trusted/f 2>/dev/null)" ]; then
		mmdebstrap "$@"
		return
	fi
	local dir rc=0
	dir=$(mktemp -d /tmp/tclone-mmdebstrap.XXXXXX)
	printf 'Dir::Etc::Trusted "%s/no-legacy-keyring.gpg";\n' "$dir" >"$dir/apt.conf"
	APT_CONFIG=$dir/apt.conf mmdebstrap "$@" || rc=$?
	rm -rf "$dir"
	return "$rc"
}
