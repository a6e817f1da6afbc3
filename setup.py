"""Only the optional compiled part lives here (metadata is in pyproject.toml): mimo_jobs.ingest._logscan, the hot loop
of log ingest. `optional=True`: without a C compiler the install still succeeds and ingest uses its pure-Python
path (same results, slower)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "mimo_jobs.ingest._logscan",
            ["mimo_jobs/ingest/_logscan.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
