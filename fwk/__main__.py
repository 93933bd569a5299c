from fwk.cli import main

main()
