"""ssdmpi: data-parallel neural-network training with SSD-SGD over MPI.

Install on a machine without MPI:      pip install -e '.[mpich]'
Install against a site MPI (clusters): pip install -e .   (mpi4py builds against the site's mpicc)
"""

import re

from setuptools import find_packages, setup


def version() -> str:
    """``__version__`` of ssdmpi/version.py, read without importing the package."""
    with open("ssdmpi/version.py", encoding="utf-8") as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


setup(
    name="ssdmpi",
    version=version(),
    license="MIT",
    description="Data-parallel neural-network training with SSD-SGD (Several Steps Delay SGD) over MPI",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["ssdmpi", "ssdmpi.*"]),
    package_data={"ssdmpi": ["presets/*.yaml", "data/digits.csv.gz", "data/digits.LICENSE.txt", "data/devil.dict.dz",
                            "data/devil.LICENSE.txt"]},
    install_requires=[
        "numpy>=1.24",
        "mpi4py>=4",
        "h5py>=3.8",
        "PyYAML>=6",
        "tqdm>=4.60",
        "threadpoolctl>=3",    # each rank limits its BLAS/OpenMP threads (ssdmpi/comm/node.py)
    ],
    extras_require={
        # The MPI runtime as a wheel, for machines without a site MPI. Site-MPI users leave it out.
        "mpich": ["mpich"],
        "gpu": ["cupy-cuda12x"],
        "plot": ["matplotlib>=3.6"],
        # ssdmpi train --tensorboard (event files; no PyTorch). tensorboard itself only reads them.
        "tensorboard": ["tensorboardX>=2.6"],
        # ssdmpi export: the global model as a .safetensors file.
        "export": ["safetensors>=0.4"],
        # torch is a test oracle only; .ci/run installs the CPU build (torch==2.13.0) explicitly.
        "test": ["pytest>=7", "pytest-timeout>=2.1", "matplotlib>=3.6", "ruff>=0.5", "safetensors>=0.4"],
    },
    entry_points={"console_scripts": ["ssdmpi = ssdmpi.cli:main"]},
    scripts=["bin/ssdmpi-netns", "bin/ssdmpi-cluster", "bin/ssdmpi-gpucheck"],
)
