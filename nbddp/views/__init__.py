"""Kernel side: how a launch is shown (terminal rendering, text and widget views, the transcript
that replaces the live view) and which view a front end gets."""
