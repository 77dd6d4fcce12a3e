from envlock.cli import console_main

console_main()
