from ckptfs.cli.main import main

main()
