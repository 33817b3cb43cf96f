"""Files that must survive a killed run: atomic writes, checkpoint IO and the bounded disk cache."""
