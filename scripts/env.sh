# Source me: the environment ggrad's tests and benchmarks run in on this machine.
# ggml lists a Vulkan device that runs on the CPU (lavapipe) only when asked to.
export GGML_VK_VISIBLE_DEVICES="${GGML_VK_VISIBLE_DEVICES:-0}"
# Without a GPU, use the newer lavapipe that bootstrap.sh unpacked (see private_lavapipe there).
_ggrad_lvp="${GGRAD_CACHE:-$HOME/.cache/ggrad}/lavapipe/lvp_icd.json"
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$_ggrad_lvp" ] && ! ls /dev/dri/renderD* /dev/nvidia* >/dev/null 2>&1; then
  export VK_DRIVER_FILES="$_ggrad_lvp"
fi
unset _ggrad_lvp
