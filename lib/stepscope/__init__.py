"""stepscope: where does each decode step's time go, and what would fixing it buy?"""

__version__ = "0.1.0"
