"""Figures of a run: style (look, FigureSet), plots (every figure), paper (Figs. 6-11 with the published markers
of published.py), hybrid (whole-model), tree (tree-verify runs). Imports nothing here: hybrid never loads plots."""
