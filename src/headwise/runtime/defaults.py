"""The Hard-Concrete gate's defaults (temperature β, stretch (γ, ζ), noise clamp ε), in a module without torch:
``pruning.config.L0Config`` takes them as its field defaults, which the command line reads to build its options."""

TEMPERATURE, STRETCH, EPS = 0.33, (-0.1, 1.1), 1e-6
