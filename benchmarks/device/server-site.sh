# Sourced by the device scripts that run the server's code on the GPU machine: installs the server's wheels from
# /tmp/wheels (carried there by benchmarks/device/server-wheels' folders, one call each while the machine stays warm)
# into /tmp/site once per machine, and puts it and lib/ on PYTHONPATH.
if [ ! -d /tmp/site/monailabel ]; then
  cat /tmp/wheels/itk_core-*.whl.part-* > /tmp/itk_core-5.4.7-cp311-abi3-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/wheels/*.whl /tmp/itk_core-*.whl
fi
export PYTHONPATH=$PWD/lib:/tmp/site PYTHONUNBUFFERED=1
